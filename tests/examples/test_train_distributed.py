"""examples/train_distributed.py under torchrun with two CPU ranks (gloo)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from dali_alchemi.bench.synth import write_synthetic_store

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "train_distributed.py"


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_two_ranks_see_disjoint_shards_and_stay_in_sync(tmp_path: Path) -> None:
    store = write_synthetic_store(tmp_path / "train.zarr", 301, seed=5, min_atoms=5, max_atoms=30)
    torchrun = shutil.which("torchrun", path=str(Path(sys.executable).parent)) or shutil.which("torchrun")
    assert torchrun, "torchrun is installed with torch"
    report = tmp_path / "report.json"
    result = subprocess.run(
        [torchrun, "--nproc-per-node", "2", "--standalone", str(EXAMPLE), str(store), "--epochs", "2",
         "--batch-size", "16", "--report", str(report)],
        capture_output=True, text=True, timeout=280,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    ranks = [json.loads(Path(f"{report}.{r}").read_text()) for r in range(2)]
    assert [r["world"] for r in ranks] == [2, 2]
    for epoch in ("0", "1"):
        a, b = (np.array(r["seen"][epoch]) for r in ranks)
        assert a.size == b.size == 151  # 301 samples, padded by one so both ranks run 10 batches
        assert len(set(a.tolist()) | set(b.tolist())) == 301
        assert len(set(a.tolist()) & set(b.tolist())) <= 1  # only the padding sample repeats
    assert ranks[0]["seen"]["0"] != ranks[0]["seen"]["1"]  # set_epoch reshuffles
    # DDP averaged the gradients: identical weights on both ranks, different from where they started
    assert ranks[0]["checksum"] == ranks[1]["checksum"]
    assert ranks[0]["losses"][0] != ranks[0]["losses"][-1]
