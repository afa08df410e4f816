"""From DALI outputs to :class:`~dali_alchemi.batch.Batch` objects, with no per-sample Python work.

Each pipeline output is a ragged list of packed batches; it is viewed as one flat tensor without a
copy (``as_reshaped_tensor`` then DLPack), and each batch is a slice of it. ``batch_ptr``,
``batch_idx`` and the neighbor-list offsets are computed on the output's device by
:class:`~dali_alchemi.batch.Batch`. No reading and no planning happen here.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import torch

from dali_alchemi.batch import Batch, collate
from dali_alchemi.pipeline.source import BATCH_IDX, INDICES, N_ATOMS, N_EDGES, OutputSpec, loader_error

if TYPE_CHECKING:
    from dali_alchemi.pipeline.build import PipelineOutputs
    from dali_alchemi.types import Level


def _flat_view(tensor_list: Any, trailing: tuple[int, ...]) -> torch.Tensor:
    """A DALI TensorList's samples, concatenated on dim 0, as one torch tensor (zero-copy when contiguous)."""
    rows = sum(int(shape[0]) for shape in tensor_list.shape())
    return torch.from_dlpack(tensor_list.as_reshaped_tensor([rows, *trailing]))


class WindowIterator:
    """Iterates one epoch of a built pipeline, yielding one Batch per training batch.

    Raises :class:`~dali_alchemi.errors.LoaderError` (with the original exception's type name and
    message) when the source or a worker failed. Stops at the end of the epoch; the caller resets
    the pipeline.
    """

    def __init__(
        self, pipe: Any, outputs: PipelineOutputs, specs: tuple[OutputSpec, ...], device: torch.device, batch_size: int
    ) -> None:
        self.pipe = pipe
        self.outputs = outputs
        self.trailing = {spec.name: spec.trailing for spec in specs}
        self.levels: dict[str, Level] = {spec.name: spec.level for spec in specs if spec.is_field}
        self.device = device
        self.batch_size = batch_size

    def _run(self) -> tuple[Any, ...] | None:
        try:
            if self.device.type == "cuda":
                return tuple(self.pipe.run(torch.cuda.current_stream(self.device)))
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
        flat = {name: _flat_view(raw[name], self.trailing[name]) for name in raw}
        host = {name: _flat_view(host_raw[name], ()).numpy() for name in (N_ATOMS, N_EDGES, INDICES)}
        return collate(
            fields={name: flat[name] for name in self.levels},
            levels=self.levels,
            n_atoms=flat[N_ATOMS],
            n_edges=flat[N_EDGES],
            host_n_atoms=host[N_ATOMS],
            host_n_edges=host[N_EDGES],
            batch_size=self.batch_size,
            sample_indices=host[INDICES],
            batch_idx=flat.get(BATCH_IDX),
        )
