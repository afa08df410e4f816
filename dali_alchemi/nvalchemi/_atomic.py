"""What nvalchemi's ``AtomicData`` validation does to each sample, done once per batch on flat tensors.

nvalchemi's ``Dataset`` (``skip_validation=False``, its default) builds one pydantic ``AtomicData`` per
structure (about 4 ms each) and collates them with ``Batch.from_data_list``. Per structure that:

1. checks each field's type and shape (pydantic with jaxtyping: dtype class, trailing shape, rows per
   atom or edge agreeing with ``atomic_numbers`` and ``neighbor_list``);
2. casts every floating-point field to the dtype of ``positions``, with a ``UserWarning`` naming them;
3. fills ``atomic_masses`` (from the periodic table), ``atom_categories`` (zeros, int64) and
   ``velocities`` (zeros like ``positions``) when the structure has none;
4. orders the keys as ``AtomicData`` declares its fields (custom fields after them).

In a window read by a :class:`~dali_alchemi.store.format.protocol.PackedReader` every field has one dtype and
one trailing shape for the whole store (its ``field_specs``), and the rows per structure come from one
pair of pointer arrays, so nothing in step 1 can differ between two structures except their atom and
edge counts. :class:`AtomicDataRules` therefore validates, through nvalchemi's own ``AtomicData``,
the structures that stand for every case (the first, the one with fewest atoms, the one with fewest
edges) once when the loader is built, raising nvalchemi's own exceptions with its messages, and learns
from them what steps 2-4 do. It then applies steps 2-4 to each batch as a handful of tensor operations
on the batch's device.
"""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from dali_alchemi.errors import ConfigError

if TYPE_CHECKING:
    from dali_alchemi.batch import Batch
    from dali_alchemi.store.format.protocol import PackedReader
    from dali_alchemi.types import Level

__all__ = ["EXCLUDED_KEYS", "FILLED", "AtomicDataRules", "representatives"]


EXCLUDED_KEYS = frozenset({"batch_idx", "batch_ptr", "device", "dtype", "info"})
"""Keys nvalchemi's collation never batches (``nvalchemi.data.batch._EXCLUDED_KEYS``)."""

FILLED = ("atomic_masses", "atom_categories", "velocities")
"""The fields ``AtomicData`` fills itself when a structure has none."""


def representatives(n_atoms: np.ndarray[Any, Any], n_edges: np.ndarray[Any, Any]) -> list[int]:
    """The structures whose validation stands for all of them: the first, the fewest atoms, the fewest edges."""
    if n_atoms.size == 0:
        return []
    return sorted({0, int(np.argmin(n_atoms)), int(np.argmin(n_edges))})


class AtomicDataRules:
    """nvalchemi's per-sample validation of one reader's structures, learned once and applied per batch.

    Parameters
    ----------
    reader
        The reader the batches come from; the representative structures are read from it once, here.
    field_levels
        The levels nvalchemi's ``Dataset`` passes to its collation (the reader's ``field_levels``).

    Raises
    ------
    pydantic.ValidationError, ValueError, TypeError
        At construction, exactly as nvalchemi's ``AtomicData.model_validate`` raises them for the first
        representative structure that fails.
    ConfigError
        If validation would add a field this module does not know how to fill.
    """

    def __init__(self, reader: PackedReader, field_levels: dict[str, str]) -> None:
        from nvalchemi.data.atomic_data import AtomicData

        self.field_levels = dict(field_levels)
        n_atoms, n_edges = reader.sample_sizes(np.arange(len(reader), dtype=np.int64))
        picked = representatives(n_atoms, n_edges)
        validated: list[Any] = []
        raw: dict[str, torch.Tensor] = {}
        for index in picked:
            sample = reader.read_packed([index]).split()[0]
            raw = {name: torch.from_numpy(np.ascontiguousarray(values)) for name, values in sample.items()}
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", UserWarning)  # the cast warning is issued per batch instead
                validated.append(AtomicData.model_validate(raw))
        self.order: list[str] | None = None
        self.casts: dict[str, torch.dtype] = {}
        self.fills: tuple[str, ...] = ()
        if not validated:
            return
        data = validated[-1]
        self.order = [
            key for key, value in data.model_dump(exclude_none=True).items()
            if key not in EXCLUDED_KEYS and isinstance(value, torch.Tensor)
        ]  # fmt: skip
        self.casts = {name: getattr(data, name).dtype for name in raw if getattr(data, name).dtype != raw[name].dtype}
        added = [name for name in self.order if name not in raw]
        unknown = [name for name in added if name not in FILLED]
        if unknown:
            raise ConfigError(f"nvalchemi's AtomicData adds fields {unknown}, which this loader cannot fill")
        self.fills = tuple(added)
        self.positions_dtype = data.positions.dtype

    def levels(self, levels: dict[str, Level]) -> dict[str, Level]:
        """``levels`` with the filled fields (all per atom) added."""
        return {**levels, **dict.fromkeys(self.fills, "atom")}  # type: ignore[arg-type]

    def apply(self, batch: Batch) -> None:
        """Cast and fill ``batch``'s fields in place, as ``AtomicData`` does to each of its structures."""
        if self.casts:
            warnings.warn(
                f"AtomicData fields {sorted(self.casts)} were cast from their original dtypes to "
                f"{self.positions_dtype} to match positions. Pass tensors with matching dtypes to silence this warning.",
                UserWarning,
                stacklevel=3,
            )
            for name, dtype in self.casts.items():
                batch.fields[name] = batch.fields[name].to(dtype)
        for name in self.fills:
            batch.add_field(name, self._fill(name, batch), "atom")

    def _fill(self, name: str, batch: Batch) -> torch.Tensor:
        positions, numbers = batch.fields["positions"], batch.fields["atomic_numbers"]
        if name == "atomic_masses":
            from nvalchemi.data.atomic_data import _default_mass_table

            table = _default_mass_table().to(device=numbers.device, dtype=positions.dtype)
            return table[numbers.long()]
        if name == "atom_categories":
            return torch.zeros_like(numbers, dtype=torch.long)
        return torch.zeros_like(positions)
