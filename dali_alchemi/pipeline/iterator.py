"""From DALI outputs to :class:`~dali_alchemi.batch.Batch` objects, with no per-sample Python work.

Each pipeline output is a ragged list of packed batches; it is viewed as one flat tensor without a
copy (``as_reshaped_tensor`` then DLPack), and each batch is a slice of it. ``batch_ptr``,
``batch_idx`` and the neighbor-list offsets are computed on the output's device by
:class:`~dali_alchemi.batch.Batch`. No reading and no planning happen here.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from dali_alchemi.batch import Batch
from dali_alchemi.pipeline.source import INDICES, N_ATOMS, N_EDGES, OutputSpec, loader_error

if TYPE_CHECKING:
    from dali_alchemi.pipeline.build import PipelineOutputs
    from dali_alchemi.types import Level


def _flat_view(tensor_list: Any) -> tuple[torch.Tensor, list[int]]:
    """A ragged DALI TensorList as one flat torch tensor (zero-copy) and its per-sample row counts."""
    shapes = tensor_list.shape()
    rows = [int(s[0]) for s in shapes]
    trailing = list(shapes[0][1:]) if shapes else []
    flat = tensor_list.as_reshaped_tensor([sum(rows), *trailing])
    return torch.from_dlpack(flat), rows


class WindowIterator:
    """Iterates one epoch of a built pipeline, yielding one Batch per training batch.

    Raises :class:`~dali_alchemi.errors.LoaderError` (with the original exception's type name and
    message) when the source or a worker failed. Stops at the end of the epoch; the caller resets
    the pipeline.
    """

    def __init__(
        self, pipe: Any, outputs: PipelineOutputs, specs: tuple[OutputSpec, ...], device: torch.device
    ) -> None:
        self.pipe = pipe
        self.outputs = outputs
        self.specs = {spec.name: spec for spec in specs}
        self.levels: dict[str, Level] = {spec.name: spec.level for spec in specs if spec.is_field}
        self.device = device

    def _run(self) -> tuple[Any, ...] | None:
        try:
            if self.device.type == "cuda":
                return tuple(self.pipe.run(torch.cuda.current_stream(self.device).cuda_stream))
            return tuple(self.pipe.run())
        except StopIteration:
            return None
        except Exception as err:
            raise loader_error(err) from err

    def windows(self) -> Iterator[list[Batch]]:
        """Yield each window of the epoch as a list of Batches."""
        n_device = len(self.outputs.device_names)
        while (raw := self._run()) is not None:
            on_device = dict(zip(self.outputs.device_names, raw[:n_device], strict=True))
            on_host = dict(zip(self.outputs.host_names, raw[n_device:], strict=True)) or on_device
            yield self._to_batches(on_device, on_host)

    def _to_batches(self, raw: dict[str, Any], host_raw: dict[str, Any]) -> list[Batch]:
        device_counts = {name: _flat_view(raw[name]) for name in (N_ATOMS, N_EDGES)}
        host = {name: _flat_view(host_raw[name])[0].numpy() for name in (N_ATOMS, N_EDGES, INDICES)}
        graphs = device_counts[N_ATOMS][1]  # structures per batch
        graph_ptr = np.concatenate([[0], np.cumsum(graphs)]).tolist()
        fields: dict[str, tuple[torch.Tensor, list[int]]] = {
            name: _flat_view(raw[name]) for name in self.outputs.device_names if name in self.levels
        }
        field_ptr = {name: np.concatenate([[0], np.cumsum(rows)]).tolist() for name, (_, rows) in fields.items()}
        batches = []
        for j in range(len(graphs)):
            g0, g1 = graph_ptr[j], graph_ptr[j + 1]
            batches.append(
                Batch(
                    fields={
                        name: flat[field_ptr[name][j] : field_ptr[name][j + 1]] for name, (flat, _) in fields.items()
                    },
                    levels=self.levels,
                    n_atoms=device_counts[N_ATOMS][0][g0:g1],
                    n_edges=device_counts[N_EDGES][0][g0:g1],
                    host_n_atoms=host[N_ATOMS][g0:g1],
                    host_n_edges=host[N_EDGES][g0:g1],
                    sample_indices=host[INDICES][g0:g1],
                )
            )
        return batches
