"""Reading a pool task's block jobs from a local store in small batches, each decoded before the next.

Fetching every chunk of a read up front and decoding afterwards holds all the compressed payloads at
once: tens of megabytes of fresh memory whose pages fault in, and which have left the CPU cache by the
time they are decoded. A local ``pread`` is cheap to issue from any thread, so each pool task instead
reads about :data:`READ_BATCH_BYTES` of its own jobs' chunks (one call to the fetcher, which merges
neighbouring ranges of a shard into one ``pread``), decodes and scatters them, and reads on; the
memory of one batch is reused by the next.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from dali_alchemi.store.read.fetch import LocalFetcher
    from dali_alchemi.store.read.gather import BlockJob

__all__ = ["READ_BATCH_BYTES", "read_and_finish"]


READ_BATCH_BYTES = 1 << 20
"""Compressed bytes a task reads before decoding them (at least one block's; a whole-object read of
unknown size counts as this much)."""


def read_and_finish(fetcher: LocalFetcher, jobs: list[BlockJob], finish: Callable[[BlockJob], None]) -> None:
    """Call ``finish`` on every job, first reading the chunks of those with pending ``requests``.

    Jobs without pending reads (their block is cached) are finished at once; the others are read in
    batches of about :data:`READ_BATCH_BYTES`, in order, and finished batch by batch.
    """
    batch: list[BlockJob] = []
    held = 0
    for job in jobs:
        if job.requests is None:
            finish(job)
            continue
        batch.append(job)
        held += sum(READ_BATCH_BYTES if r.stop is None else r.stop - r.start for r in job.requests[0] if r is not None)
        if held >= READ_BATCH_BYTES:
            _read(fetcher, batch)
            for ready in batch:
                finish(ready)
            batch, held = [], 0
    if batch:
        _read(fetcher, batch)
        for ready in batch:
            finish(ready)


def _read(fetcher: LocalFetcher, jobs: list[BlockJob]) -> None:
    """Read the pending chunks of ``jobs`` on this thread in one call, into each job's ``payloads``."""
    present = [r for job in jobs if job.requests is not None for r in job.requests[0] if r is not None]
    fetched = iter(fetcher.read(present))
    for job in jobs:
        assert job.requests is not None
        requests, keys = job.requests
        job.payloads = ([None if r is None else next(fetched) for r in requests], keys)
        job.requests = None
