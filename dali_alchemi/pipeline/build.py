"""Building the DALI pipeline: one batch-aware external source, ``.gpu()`` outputs on a GPU.

The pipeline's batch is one window: one DALI sample per output.
On a CUDA device the outputs placed on the device (the fields and counts, or the window blob) go
``.gpu()``: DALI then stages them in pinned memory and copies them asynchronously; the host keeps
its own copy of the sizes (counts and indices, or the blob's header) so batch sizes never need a
device synchronisation. Without a GPU the same graph runs with ``device_id=None``.
With workers, the source travels wrapped in a :class:`~dali_alchemi.pipeline.lifetime.GuardedSource`
and the workers start inside :func:`~dali_alchemi.pipeline.lifetime.starting_workers`, so each one ends
with the training process. No data logic lives here.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from nvidia.dali import fn, types
from nvidia.dali.pipeline import Pipeline

from dali_alchemi.pipeline.dali_private import close_pipeline
from dali_alchemi.pipeline.inflate import inflate_nodes
from dali_alchemi.pipeline.lifetime import GuardedSource, WorkerGuard, starting_workers
from dali_alchemi.types import PerLevel

if TYPE_CHECKING:
    from dali_alchemi.pipeline.inflate import InflateRoute
    from dali_alchemi.pipeline.source import OutputSpec
    from dali_alchemi.plan import EpochPlan
    from dali_alchemi.types import CountArray

__all__ = ["SHM_HEADROOM", "SHM_SLACK_BYTES", "PipelineOutputs", "build_pipeline", "window_bytes_hint"]


logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class PipelineOutputs:
    """Names of the pipeline's outputs, in order: device outputs first, then host-only copies."""

    device_names: tuple[str, ...]
    host_names: tuple[str, ...]

    @property
    def names(self) -> tuple[str, ...]:
        return self.device_names + self.host_names


def build_pipeline(
    source: Any,
    specs: tuple[OutputSpec, ...],
    *,
    device_id: int | None,
    num_workers: int,
    start_method: str,
    queue_depth: int,
    bytes_per_window: int,
    num_threads: int = 2,
    route: InflateRoute | None = None,
) -> tuple[Pipeline, PipelineOutputs]:
    """Build (and start) the pipeline; returns it with the names of its outputs.

    With an inflate ``route`` (a CUDA device only), each inflated field's blocks go to nvCOMP's inflate
    and the field's output is its inflated chunks (:mod:`dali_alchemi.pipeline.inflate`).
    """
    parallel = num_workers > 0
    pipe = Pipeline(
        batch_size=1,
        num_threads=num_threads,
        device_id=device_id,
        prefetch_queue_depth=queue_depth,
        py_num_workers=max(1, num_workers),
        py_start_method=start_method,
        exec_dynamic=True,
    )
    source_kwargs: dict[str, Any] = {"no_copy": True}
    guard = WorkerGuard.for_current_thread()
    if parallel:
        source = GuardedSource(source, guard)
        # One task per window; at least one window in flight per worker (dali-notes section 2.1).
        source_kwargs.update(prefetch_queue_depth=max(num_workers, 1), bytes_per_sample_hint=bytes_per_window)
    with pipe:
        nodes = fn.external_source(
            source=source,
            num_outputs=len(specs),
            batch=True,
            batch_info=True,
            parallel=parallel,
            dtype=[types.to_dali_type(spec.dtype) for spec in specs],
            ndim=[spec.ndim for spec in specs],
            **source_kwargs,
        )
        nodes = list(nodes) if isinstance(nodes, (list, tuple)) else [nodes]  # type: ignore[list-item]
        if device_id is None:
            outputs = PipelineOutputs(device_names=tuple(s.name for s in specs), host_names=())
            pipe.set_outputs(*nodes)
        else:
            by_name = dict(zip((s.name for s in specs), nodes, strict=True))
            on_device = [spec.name for spec in specs if spec.placement in ("device", "both")]
            host = [spec.name for spec in specs if spec.placement in ("host", "both")]
            inflated: dict[str, Any] = {}
            if route is not None:
                inflated = inflate_nodes(by_name, route)
                on_device = route.device_outputs(on_device)
            outputs = PipelineOutputs(device_names=tuple(on_device), host_names=tuple(host))
            device_nodes = (inflated[name] if name in inflated else by_name[name].gpu() for name in on_device)
            pipe.set_outputs(*device_nodes, *(by_name[name] for name in host))
    try:
        with starting_workers(guard, fork=parallel and start_method == "fork"):  # the workers start in build()
            pipe.build()
    except BaseException:  # Ctrl-C, say: workers may have started, and the pipeline is not returned
        close_pipeline(pipe)
        raise
    logger.debug("built pipeline: %d outputs, %d workers", len(outputs.names), num_workers)
    return pipe, outputs


SHM_HEADROOM, SHM_SLACK_BYTES = 1.5, 1 << 16
"""Shared-memory hint: average window bytes times this headroom, plus slack for small windows."""


def window_bytes_hint(
    specs: Sequence[OutputSpec], sizes: tuple[CountArray, CountArray], epoch_plan: EpochPlan, batches_per_window: int
) -> int:
    """A generous estimate of one window's bytes, so DALI's shared memory rarely has to grow.

    ``sizes`` are the atom and edge counts of the reader's structures, or of an even sample of them
    (:data:`~dali_alchemi.loader_inputs.SIZE_SAMPLE`): only their means are used.
    """
    n_atoms, n_edges = sizes
    if n_atoms.size == 0:
        return SHM_SLACK_BYTES
    rows = PerLevel(atom=float(n_atoms.mean()), edge=float(n_edges.mean()), system=1.0)
    per_structure = sum(rows[spec.level] * spec.row_bytes for spec in specs if spec.level is not None)
    per_batch = int(epoch_plan.batch_ptr[-1]) / max(1, epoch_plan.num_batches)
    return int(per_structure * per_batch * batches_per_window * SHM_HEADROOM) + SHM_SLACK_BYTES
