"""store/read/mapped_pages.py: a reading process lets go of the pages it mapped of big shared copies."""

from __future__ import annotations

import mmap
from pathlib import Path

import numpy as np
import pytest

from dali_alchemi.store.read import mapped_pages


def _resident_kib(path: Path) -> int:
    """KiB of ``path`` this process has mapped in (the ``Rss`` of its mappings in ``/proc/self/smaps``)."""
    total, inside = 0, False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        fields = line.split()
        if fields and "-" in fields[0] and not fields[0].endswith(":"):
            inside = line.rstrip().endswith(str(path))
        elif inside and fields[0] == "Rss:":
            total += int(fields[1])
    return total


def test_mapped_pages_count_reads_and_let_go_only_of_big_maps(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "pages"
    path.write_bytes(np.arange(1 << 16, dtype=np.int64).tobytes())  # 512 KiB
    monkeypatch.setattr(mapped_pages, "MAPPED_BYTES", 256 << 10)
    monkeypatch.setattr(mapped_pages, "FAULT_BYTES", 64 << 10)
    with path.open("rb") as f:
        mapping = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    values = np.frombuffer(mapping, dtype=np.int64)
    pages = mapped_pages.MappedPages()
    assert int(values[::512].sum()) == sum(range(0, 1 << 16, 512)) and _resident_kib(path) > 0
    pages.read([values[10:20], None], 1)  # 2 faults of 64 KiB: not yet due
    assert _resident_kib(path) > 0
    pages.read([values[10:20], None], 1)  # 4 faults: 256 KiB, due
    assert _resident_kib(path) == 0
    np.testing.assert_array_equal(values[:5], np.arange(5))  # the values read back through the map
    del values
    mapping.close()
