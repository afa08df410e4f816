"""store/read/io_batches.py: a task's block jobs read in bounded batches, each finished before the next is read."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from dali_alchemi.store.read import io_batches as batches
from dali_alchemi.store.read.fetch import ByteRequest
from dali_alchemi.store.read.gather import BlockJob, LevelPlan
from dali_alchemi.store.read.io_batches import read_and_finish


class _Recording:
    """A fetcher whose ``read`` answers each range with its own description, and records each call."""

    def __init__(self) -> None:
        self.calls: list[list[tuple[int, int | None]]] = []

    def read(self, requests: list[ByteRequest]) -> list[Any]:
        self.calls.append([(r.start, r.stop) for r in requests])
        return [f"{r.key}:{r.start}-{r.stop}" for r in requests]


def _job(block: int, spans: list[tuple[int, int] | None] | None) -> BlockJob:
    plan = LevelPlan(rows=np.zeros(0, np.int64), dest=np.zeros(0, np.int64), total=0)
    job = BlockJob(handle=None, block=block, plan=plan, lo=0, hi=0, data=None if spans else np.zeros(1))  # type: ignore[arg-type]
    if spans is not None:
        requests = [None if s is None else ByteRequest("s", start=s[0], stop=s[1]) for s in spans]
        job.requests = (requests, ["s"] * len(spans))
    return job


def test_jobs_are_read_in_batches_of_about_read_batch_bytes_then_finished(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(batches, "READ_BATCH_BYTES", 100)
    jobs = [
        _job(0, [(0, 60)]),
        _job(1, None),  # cached: finished at once, nothing read
        _job(2, [(60, 120), None]),  # 60 more bytes: the batch is full; an unwritten chunk reads as None
        _job(3, [(120, 150)]),
        _job(4, [(150, 170)]),  # the rest, read at the end
    ]
    fetcher = _Recording()
    finished: list[tuple[int, int]] = []

    def finish(job: BlockJob) -> None:
        assert job.requests is None  # its reads are done
        finished.append((job.block, len(fetcher.calls)))

    read_and_finish(fetcher, jobs, finish)  # type: ignore[arg-type]
    assert fetcher.calls == [[(0, 60), (60, 120)], [(120, 150), (150, 170)]]
    assert finished == [(1, 0), (0, 1), (2, 1), (3, 2), (4, 2)]  # each job once, after its batch's read
    assert jobs[2].payloads == (["s:60-120", None], ["s", "s"])
    assert jobs[4].payloads == (["s:150-170"], ["s"])


def test_a_failing_read_finishes_nothing_of_its_batch() -> None:
    class _Failing(_Recording):
        def read(self, requests: list[ByteRequest]) -> list[Any]:
            raise OSError("disk gone")

    finished: list[int] = []
    with pytest.raises(OSError, match="disk gone"):
        read_and_finish(_Failing(), [_job(0, [(0, 10)]), _job(1, [(10, 20)])], lambda job: finished.append(job.block))  # type: ignore[arg-type]
    assert finished == []
