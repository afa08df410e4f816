"""How one read takes each array's rows: through zarr, in place, from an array held whole, or by blocks.

Arrays the engine cannot decode are read through zarr; uncompressed arrays of a local store too big
for the cache are read in place (:mod:`dali_alchemi.store.read.rows`); an array held whole in the
cache ("resident") is read with one take; every other array is read by the row blocks its rows
touch. A small array is worth keeping whole (:data:`WHOLE_ARRAY_SHARE`): the router counts, per
array, the blocks reads touched since the snapshot was attached, and routes it to be read whole once
they are enough. Routing only decides; the engine reads.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from dali_alchemi.store.read.gather import block_jobs, every_block
from dali_alchemi.store.read.rows import reads_rows
from dali_alchemi.store.read.whole import reads_whole

if TYPE_CHECKING:
    import numpy as np
    from numpy.typing import NDArray

    from dali_alchemi.store.read.codecs import ArrayCodec
    from dali_alchemi.store.read.decoder import BlockDecoder
    from dali_alchemi.store.read.gather import BlockJob, Plan
    from dali_alchemi.store.read.snapshot import ArrayHandle
    from dali_alchemi.types import Level, PerLevel

__all__ = ["WHOLE_ARRAY_SHARE", "Router", "Routes"]


WHOLE_ARRAY_SHARE = 4
"""Once reads since the store was opened have touched 1/this of the blocks of an array that fits a
quarter of the cache, the next read decodes all of them and the array is kept whole: with small
chunks a shuffled window touches most blocks but never all, a sequential epoch touches a few per
window, and per-block lookups would otherwise cost every later read (0: never)."""


@dataclass(slots=True)
class Routes:
    """How one read takes the rows of each of its arrays (arrays with no rows to read are left out)."""

    through_zarr: list[tuple[ArrayHandle, Plan]] = field(default_factory=list)
    """Arrays the engine cannot decode: read through zarr."""
    in_place: list[tuple[str, ArrayCodec, Plan]] = field(default_factory=list)
    """Uncompressed arrays whose rows are read in place."""
    resident: list[tuple[str, NDArray[Any]]] = field(default_factory=list)
    """Arrays held whole: one take each."""
    whole: list[tuple[ArrayHandle, Plan, NDArray[np.int64], NDArray[np.int64]]] = field(default_factory=list)
    """Arrays to read whole now (then resident), with their block plan in case a chunk is bad."""
    to_stitch: list[str] = field(default_factory=list)
    """Arrays whose every block this read decodes, to be stitched into one resident array."""
    jobs: list[BlockJob] = field(default_factory=list)
    """Block jobs: one per row block touched, per array read block by block."""


class Router:
    """Routes the arrays of each read, through ``decoder``'s cache; remembers what reads touched.

    Call :meth:`reset` when a new snapshot is attached.
    """

    def __init__(self, decoder: BlockDecoder) -> None:
        self._decoder = decoder
        self._block_touches: dict[str, int] = {}  # per array, blocks its reads touched since reset()
        self._whole_failed: set[str] = set()  # arrays with a bad chunk: read block by block
        self._kept_whole: set[str] = set()  # arrays routed to be kept whole since reset()

    def reset(self) -> None:
        """Forget the blocks touched and the arrays that could not be read whole (a new snapshot)."""
        self._block_touches.clear()
        self._whole_failed.clear()
        self._kept_whole.clear()

    def not_whole(self, name: str) -> None:
        """Array ``name`` has a bad chunk: never route it to be read whole again (its good blocks read fine)."""
        self._whole_failed.add(name)

    def route(
        self, handles: Mapping[str, ArrayHandle], names: Sequence[str], plans: PerLevel[Plan], in_place: bool
    ) -> Routes:
        """Sort arrays ``names`` by how their rows are read; ``in_place``: whether uncompressed arrays are read in place."""
        routes = Routes()
        block_plans: dict[tuple[Level, int], tuple[NDArray[np.int64], NDArray[np.int64]]] = {}
        for name in names:
            handle = handles[name]
            plan = plans[handle.level]
            if plan.total == 0:
                continue
            if handle.codec is None:
                routes.through_zarr.append((handle, plan))
                continue
            if in_place and reads_rows(handle.codec):
                routes.in_place.append((name, handle.codec, plan))
                continue
            whole = self._decoder.resident(name)
            if whole is not None:
                routes.resident.append((name, whole))
                continue
            key = (handle.level, handle.codec.block_rows)
            if key not in block_plans:
                block_plans[key] = plan.blocks(handle.codec.block_rows)
            self._route_blocks(handle, plan, *block_plans[key], routes)
        return routes

    def run_route(self, handle: ArrayHandle, touched: int, in_place: bool) -> str | NDArray[Any] | None:
        """How a read of one run of samples (:mod:`~dali_alchemi.store.read.contiguous`) takes ``handle``'s rows,
        which touch ``touched`` row blocks: ``"rows"`` in place, ``"blocks"`` by its one-chunk blocks, the
        array held whole, or ``None`` where :meth:`route` decides. Counts nothing: call :meth:`touched`
        once the blocks were read this way."""
        codec = handle.codec
        if codec is None:
            return None
        if in_place and reads_rows(codec):
            return "rows"
        whole = self._decoder.resident(handle.name)
        if whole is not None:
            return whole
        if not codec.one_chunk_blocks or self._blocks_route(handle, touched) != "blocks":
            return None
        return "blocks"

    def touched(self, name: str, blocks: int) -> None:
        """Count ``blocks`` row blocks of array ``name`` as read (what decides when it is kept whole)."""
        self._block_touches[name] = self._block_touches.get(name, 0) + blocks

    def _blocks_route(self, handle: ArrayHandle, touched: int) -> str:
        """``"whole"``, ``"stitch"`` or ``"blocks"``: how an array read by blocks, ``touched`` of them now, is read.

        An array that fits a quarter of the cache (and no shared folder) is kept whole once reads have
        touched 1/:data:`WHOLE_ARRAY_SHARE` of its blocks: read whole with one read per stored object
        where it can be (and has no bad chunk), else by decoding every block in this read. Only once: an
        array kept whole that the cache then evicted (the blocks of bigger arrays streaming through a small
        cache) is read by blocks from then on, not read whole again window after window.
        """
        name, codec = handle.name, handle.codec
        assert codec is not None
        nbytes = codec.row_nbytes * handle.shape[0]
        touches = self._block_touches.get(name, 0) + touched
        capacity = self._decoder.cache.capacity_bytes
        small = WHOLE_ARRAY_SHARE > 0 and nbytes <= capacity // 4 and not self._decoder.shares_blocks
        if name in self._kept_whole:
            return "blocks"  # kept whole before, and evicted since (it would be resident otherwise)
        if small and reads_whole(codec) and name not in self._whole_failed:
            if touches * WHOLE_ARRAY_SHARE >= codec.n_blocks:
                return "whole"
        elif small and touched * WHOLE_ARRAY_SHARE >= codec.n_blocks:
            return "stitch"
        return "blocks"

    def _route_blocks(
        self,
        handle: ArrayHandle,
        plan: Plan,
        blocks: NDArray[np.int64],
        bounds: NDArray[np.int64],
        routes: Routes,
    ) -> None:
        """Route an array read by its ``blocks``: whole, every block then stitched, or the blocks touched."""
        name, codec = handle.name, handle.codec
        assert codec is not None
        how = self._blocks_route(handle, int(blocks.size))
        self.touched(name, int(blocks.size))
        if how != "blocks":
            self._kept_whole.add(name)
        if how == "whole":
            routes.whole.append((handle, plan, blocks, bounds))  # one read per stored object, then resident
            return
        if how == "stitch":
            blocks, bounds = every_block(blocks, bounds, codec.n_blocks)
            routes.to_stitch.append(name)  # read whole once, then one resident array: no per-block work again
        routes.jobs += block_jobs(handle, plan, blocks, bounds)
