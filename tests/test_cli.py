from __future__ import annotations

import json
from pathlib import Path

import pytest

from dali_alchemi.cli import main


def test_synth_then_inspect(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "200")
    store = tmp_path / "s.zarr"
    assert main(["synth", str(store), "--n", "25", "--seed", "1"]) == 0
    assert main(["inspect", str(store)]) == 0
    out = capsys.readouterr().out
    assert "samples: 25" in out
    assert "core/positions" in out and "atom" in out and "float32" in out
    assert "blosc(clevel=5,cname=lz4,shuffle=shuffle)" in out and "on disk:" in out


def test_errors_are_reported_not_raised(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["inspect", str(tmp_path / "missing.zarr")]) == 2
    assert "StoreNotFoundError" in capsys.readouterr().out
    store = tmp_path / "s.zarr"
    main(["synth", str(store), "--n", "2"])
    assert main(["synth", str(store), "--n", "2"]) == 2
    assert "already exists" in capsys.readouterr().out


def test_augment_cost_writes_its_medians(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "augment.json"
    assert main(["augment-cost", "--device", "cpu", "--batch-size", "4", "--repeats", "1", "--json", str(out)]) == 0
    records = json.loads(out.read_text())
    assert [r["augmentation"] for r in records] == ["rotation", "position noise", "translation", "all three"]
    assert all(r["device"] == "cpu" and r["batch_size"] == 4 and r["ms_per_batch"] > 0 for r in records)
    assert "ms per batch" in capsys.readouterr().out
