"""The ``"inflate"`` window layout: compressed chunks cross to the GPU as stored and inflate there.

With ``DALIDataLoader(layout="inflate")`` the fields a store keeps as numcodecs LZ4 blocks (the
``"inflate"`` store layout) are not decoded on the host. The source sends, per such field, the raw LZ4
blocks of the chunks the window touches, their sizes and the row each wanted row has in the inflated
chunks (:mod:`dali_alchemi.store.read.compressed`); DALI copies the blocks to the device through pinned
memory and nvCOMP inflates them there (``fn.decoders.inflate``, one call per field and window); the
iterator takes the wanted rows with one gather and makes store-global atom indices sample-local
(:func:`assemble`). Every other field travels as in the ``"window"`` layout. Batches are identical to
the other layouts'.

It needs a CUDA device; the host half (what the source sends) and :func:`assemble` run anywhere, with
:func:`~dali_alchemi.store.read.compressed.inflate_reference` standing in for nvCOMP.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from dali_alchemi.errors import ConfigError, DeviceError, StoreFormatError
from dali_alchemi.pipeline.source import BATCH_BOUNDS, INDICES, N_ATOMS, N_EDGES, OutputSpec, output_specs
from dali_alchemi.store.format.layout import ATOM_INDEX_FIELDS
from dali_alchemi.store.format.protocol import InflatedChunks
from dali_alchemi.store.read.compressed import inflated_rows

if TYPE_CHECKING:
    from numpy.typing import NDArray

    from dali_alchemi.plan.base import Window
    from dali_alchemi.store.format.protocol import FieldSpec, PackedReader
    from dali_alchemi.types import Level

__all__ = [
    "ARGUMENT", "ATOM_STARTS", "BLOCKS", "ROWS", "SIZES", "InflateRoute", "InflatedField", "assemble",
    "inflate_nodes", "inflate_route", "read_inflate_window",
]  # fmt: skip


BLOCKS = "__lz4_blocks:"
"""Output name prefix of a field's raw LZ4 blocks (uint8, to the device)."""
SIZES = "__lz4_sizes:"
"""Output name prefix of a field's block sizes (int32: the inflate's ``chunk_sizes``, kept in the pipeline)."""
ROWS = "__lz4_rows:"
"""Output name prefix of where each wanted row lies in a field's inflated chunks (int64, to the device)."""
ATOM_STARTS = "__atom_starts"
"""Each structure's first atom row in the store (int64, to the device): makes atom indices sample-local."""
ARGUMENT = "argument"
"""The placement of an output consumed inside the pipeline (an operator's argument), never returned."""


@dataclass(frozen=True, slots=True, kw_only=True)
class InflatedField(InflatedChunks):
    """A field the GPU inflates: its name and level, and what its blocks inflate to."""

    name: str
    level: Level


@dataclass(frozen=True, slots=True)
class InflateRoute:
    """The inflated fields of a loader, and every output its source emits."""

    fields: tuple[str, ...]
    inflated: tuple[InflatedField, ...]
    host_fields: tuple[str, ...]
    specs: tuple[OutputSpec, ...]

    def read(self, reader: Any, window: Window) -> tuple[list[NDArray[Any]], ...]:
        """The source's read of one window (:func:`read_inflate_window`)."""
        return read_inflate_window(reader, window, self)

    def device_outputs(self, names: Sequence[str]) -> list[str]:
        """The pipeline's device outputs: ``names``, with each field's blocks replaced by the field inflated."""
        return [name.removeprefix(BLOCKS) for name in names]

    @property
    def rebases(self) -> bool:
        """Whether an inflated field holds store-global atom indices (the source sends atom starts)."""
        return any(f.name in ATOM_INDEX_FIELDS for f in self.inflated)


def inflate_route(reader: PackedReader, fields: Sequence[str], device: torch.device) -> InflateRoute:
    """The route of ``fields`` through the ``"inflate"`` layout.

    Raises
    ------
    DeviceError
        If ``device`` is not a CUDA device (nvCOMP inflates on the GPU).
    ConfigError
        If the reader cannot send compressed chunks, or no field is stored as LZ4 blocks.
    """
    if device.type != "cuda":
        raise DeviceError(
            f"layout='inflate' inflates chunks on the GPU with DALI's nvCOMP and needs a CUDA device, not {device}; "
            "use layout='window' on the CPU"
        )
    if not hasattr(reader, "read_compressed"):
        raise ConfigError(
            f"layout='inflate' needs a reader of one zarr store (AtomicDataZarrReader), not {type(reader).__name__}"
        )
    specs: Mapping[str, FieldSpec] = reader.field_specs
    inflated = tuple(
        InflatedField(
            name=n, level=specs[n].level, chunk_shape=chunks.chunk_shape, dtype=chunks.dtype, shuffle=chunks.shuffle
        )
        for n in fields
        if (chunks := specs[n].inflate) is not None
    )
    if not inflated:
        raise ConfigError(
            f"layout='inflate': none of the fields {list(fields)} is stored as LZ4 blocks DALI can inflate; "
            "write or rewrite the store with layout 'inflate' (dali-alchemi rewrite STORE OUT --layout inflate)"
        )
    names = {f.name for f in inflated}
    host_fields = tuple(n for n in fields if n not in names)
    int64 = np.dtype(np.int64)
    route_specs = list(output_specs(specs, host_fields))
    for f in inflated:
        route_specs += [
            OutputSpec(BLOCKS + f.name, np.dtype(np.uint8), (), f.level, "device", hint_row_bytes=f.row_bytes),
            OutputSpec(SIZES + f.name, np.dtype(np.int32), (), f.level, ARGUMENT),
            OutputSpec(ROWS + f.name, int64, (), f.level, "device"),
        ]
    if any(f.name in ATOM_INDEX_FIELDS for f in inflated):
        route_specs.append(OutputSpec(ATOM_STARTS, int64, (), "system", "device"))
    return InflateRoute(fields=tuple(fields), inflated=inflated, host_fields=host_fields, specs=tuple(route_specs))


def read_inflate_window(reader: Any, window: Window, route: InflateRoute) -> tuple[list[NDArray[Any]], ...]:
    """One window's outputs in the ``"inflate"`` layout (the source's read), in ``route.specs`` order."""
    names = tuple(f.name for f in route.inflated)
    if route.host_fields:
        packed = reader.read_packed(window.indices, fields=route.host_fields)
        arrays: dict[str, Any] = dict(packed.fields)
        n_atoms, n_edges, logical = packed.n_atoms, packed.n_edges, packed.logical_indices
    else:
        arrays = {}
        logical = reader.normalize_indices(window.indices)
        n_atoms, n_edges = reader.sample_sizes(logical)
    compressed = reader.read_compressed(logical, fields=names)
    arrays.update({N_ATOMS: n_atoms, N_EDGES: n_edges, INDICES: logical, BATCH_BOUNDS: window.batch_bounds})
    for name, part in compressed.parts.items():
        arrays.update({BLOCKS + name: part.blocks, SIZES + name: part.sizes, ROWS + name: part.rows})
    if route.rebases:
        arrays[ATOM_STARTS] = compressed.atom_starts
    return tuple([arrays[spec.name]] for spec in route.specs)


def inflate_nodes(nodes: Mapping[str, Any], route: InflateRoute) -> dict[str, Any]:
    """The pipeline's inflate operators: each field's blocks inflated on the device to ``[chunks, chunk_bytes]``
    bytes (still shuffled, when stored so), by field name."""
    from nvidia.dali import fn, types

    inflate = fn.decoders.inflate  # nvCOMP (fn.experimental.inflate is its older name)
    return {
        f.name: inflate(
            nodes[BLOCKS + f.name].gpu(), chunk_sizes=nodes[SIZES + f.name], shape=[f.chunk_bytes],
            dtype=types.DALIDataType.UINT8, algorithm="LZ4",
        )
        for f in route.inflated
    }


def _torch_dtype(dtype: np.dtype[Any]) -> torch.dtype:
    return torch.from_numpy(np.empty(0, dtype=dtype)).dtype


def assemble(
    inflated: Mapping[str, torch.Tensor],
    rows: Mapping[str, torch.Tensor],
    route: InflateRoute,
    *,
    n_atoms: torch.Tensor,
    n_edges: torch.Tensor,
    atom_starts: torch.Tensor | None,
    host_n_edges: NDArray[np.int64],
    sample_indices: NDArray[np.int64],
) -> dict[str, torch.Tensor]:
    """The window's flat rows of every inflated field, from its inflated chunks (``[chunks, chunk_bytes]`` uint8).

    Atom-index fields come back sample-local, as the reader returns them; an index outside its own
    structure raises, as reading it on the host would.

    Raises
    ------
    StoreFormatError
        Naming the structure whose atom index points outside its atoms.
    """
    out: dict[str, torch.Tensor] = {}
    for f in route.inflated:
        values = inflated_rows(inflated[f.name], rows[f.name], f, _torch_dtype(f.dtype))
        if f.name in ATOM_INDEX_FIELDS and values.numel():
            assert atom_starts is not None
            total = int(host_n_edges.sum())
            values -= torch.repeat_interleave(atom_starts, n_edges, output_size=total).to(values.dtype).view(-1, 1)
            limit = torch.repeat_interleave(n_atoms, n_edges, output_size=total).to(values.dtype).view(-1, 1)
            bad = ((values < 0) | (values >= limit)).any(dim=1)
            if bool(bad.any()):  # one device synchronisation per window, as the host path checks every read
                edge = int(torch.argmax(bad.to(torch.uint8)))
                sample = int(np.searchsorted(np.cumsum(host_n_edges), edge, side="right"))
                raise StoreFormatError(
                    f"{f.name} of sample {int(sample_indices[sample])} holds {values[edge].tolist()} (sample-local), "
                    f"outside its {int(n_atoms[sample])} atoms; the store's atom indices are corrupt "
                    "(dali-alchemi verify names the damage)"
                )
        out[f.name] = values
    return out
