"""Each chunk decoded at most once per epoch, per process and (with the shared folder) per machine."""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest

pytest.importorskip("nvidia.dali", reason="NVIDIA DALI cannot be imported")

from dali_alchemi import DALIDataLoader
from dali_alchemi.plan import EpochPlan
from dali_alchemi.store.read.codecs import ArrayCodec

pytestmark = pytest.mark.dali

N = 300  # structures in small_store


class SpanPlan:
    """Spans of contiguous structures in shuffled order, cut into batches (a block order in miniature)."""

    def __init__(self, num_samples: int, span: int, batch_size: int, seed: int = 0) -> None:
        self.num_samples, self.span, self.batch_size, self.seed = num_samples, span, batch_size, seed

    def epoch(self, epoch: int) -> EpochPlan:
        starts = np.arange(0, self.num_samples, self.span)
        rng = np.random.default_rng((self.seed, epoch))
        order = np.concatenate([np.arange(s, min(s + self.span, self.num_samples)) for s in rng.permutation(starts)])
        ptr = np.append(np.arange(0, order.size, self.batch_size), order.size)
        return EpochPlan(epoch=epoch, order=order.astype(np.int64), batch_ptr=ptr.astype(np.int64))

    def to_dict(self) -> dict[str, Any]:
        return {"kind": "span", "span": self.span, "batch_size": self.batch_size, "seed": self.seed}


def _count_decodes(monkeypatch: pytest.MonkeyPatch, folder: Path) -> None:
    """Make every process (forked workers too) log each block it decodes to a file of its own."""
    decode = ArrayCodec.decode_block

    def logged(codec: ArrayCodec, block: int, *args: Any) -> Any:
        fd = os.open(folder / f"{os.getpid()}.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND)
        try:
            os.write(fd, f"{codec.name} {block}\n".encode())
        finally:
            os.close(fd)
        return decode(codec, block, *args)

    monkeypatch.setattr(ArrayCodec, "decode_block", logged)


def _decodes(folder: Path) -> dict[int, Counter[tuple[str, int]]]:
    """Data chunks decoded, per process (each process reads the small meta arrays once when it opens)."""
    per_process = {}
    for log in folder.glob("*.log"):
        lines = [line.split() for line in log.read_text().splitlines() if not line.startswith("meta/")]
        if not lines:
            continue
        per_process[int(log.stem)] = Counter((name, int(block)) for name, block in lines)
    return per_process


@pytest.mark.timeout(120)
@pytest.mark.parametrize(("workers", "shared"), [(0, True), (2, False), (2, True)])
def test_each_chunk_is_decoded_at_most_once_per_epoch(
    small_store: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, workers: int, shared: bool
) -> None:
    _count_decodes(monkeypatch, tmp_path)
    plan = SpanPlan(N, span=25, batch_size=10)
    with DALIDataLoader(
        small_store, plan=plan, batches_per_window=2, num_workers=workers, start_method="fork", device="cpu",
        shared_cache=shared,
    ) as loader:  # fmt: skip
        delivered = np.concatenate([batch.sample_indices for batch in loader])
        assert np.array_equal(np.sort(delivered), np.arange(N))
        first = _decodes(tmp_path)
        for _ in loader:  # a second epoch: everything is still cached, nothing is decoded again
            pass
    per_process = _decodes(tmp_path)
    assert per_process and all(max(c.values()) == 1 for c in per_process.values())  # once per process
    machine = sum(per_process.values(), Counter())
    if workers:
        assert os.getpid() not in per_process  # the training process decodes nothing
    if workers == 0 or shared:
        assert max(machine.values()) == 1  # and once per machine, over both epochs
        assert sum(machine.values()) == sum(sum(c.values()) for c in first.values())  # epoch 2 decoded nothing
    else:
        assert max(machine.values()) == workers  # private caches: blocks the workers share decode in each
