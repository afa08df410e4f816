"""store/read/pointers.py: meta arrays decoded and checked chunk by chunk; the segment checksums of a state."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import zarr

from dali_alchemi.bench.synth import write_synthetic_store
from dali_alchemi.config import ArrayConfig, WriteConfig
from dali_alchemi.errors import StoreFormatError
from dali_alchemi.store.format import layout
from dali_alchemi.store.read import pointers
from dali_alchemi.store.read.pointers import PrivateMeta, read_meta_values, segment_crcs, state_digest

CONFIG = WriteConfig(meta=ArrayConfig(chunk_size=64))
N = 500


@pytest.fixture()
def store(tmp_path: Path) -> Path:
    return write_synthetic_store(tmp_path / "s.zarr", N, seed=2, min_atoms=1, max_atoms=4, config=CONFIG)


def _read(path: Path, *, complete: bool = True, deleted: tuple[int, ...] = ()) -> PrivateMeta:
    meta = zarr.open_group(path / "meta", mode="r")
    sink = PrivateMeta(N)
    arrays = {name: meta[name] for name in (layout.SAMPLES_MASK, layout.ATOMS_PTR, layout.EDGES_PTR)}
    read_meta_values(arrays, N, store="S", complete=complete, deleted=deleted, sink=sink)
    return sink


@pytest.mark.parametrize("complete", [True, False])
def test_chunks_are_read_whole_and_unfinished_deletes_applied(store: Path, complete: bool) -> None:
    whole = zarr.open_group(store / "meta", mode="r")
    got = _read(store, complete=complete, deleted=(3, 64, 499, 10_000))
    np.testing.assert_array_equal(got.arrays[layout.ATOMS_PTR], whole["atoms_ptr"][:])
    np.testing.assert_array_equal(got.arrays[layout.EDGES_PTR], whole["edges_ptr"][:])
    assert np.flatnonzero(~got.arrays[layout.SAMPLES_MASK]).tolist() == [3, 64, 499]


@pytest.mark.parametrize("complete", [True, False])
def test_a_pointer_that_drops_at_a_chunk_boundary_is_named_by_its_entries(store: Path, complete: bool) -> None:
    ptr = zarr.open_array(store / "meta" / "edges_ptr", mode="r+")
    ptr[128] = int(ptr[127]) - 1  # the first entry of the third chunk, below the last of the second
    with pytest.raises(
        StoreFormatError, match=r"^Store S: meta/edges_ptr is not monotonic: entry 128 \(\d+\) < entry 127 \(\d+\)$"
    ):
        _read(store, complete=complete)


def test_a_pointer_that_does_not_start_at_0_is_refused(store: Path) -> None:
    zarr.open_array(store / "meta" / "atoms_ptr", mode="r+")[0] = 5
    with pytest.raises(StoreFormatError, match=r"^Store S: meta/atoms_ptr starts at 5; expected 0$"):
        _read(store)


def test_the_digest_of_a_prefix_is_the_same_from_precomputed_or_fresh_checksums(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(pointers, "SEGMENT_ROWS", 8)
    rng = np.random.default_rng(0)
    arrays = {
        layout.ATOMS_PTR: np.cumsum(np.r_[0, rng.integers(1, 5, 50)]),
        layout.EDGES_PTR: np.cumsum(np.r_[0, rng.integers(0, 9, 50)]),
        layout.SAMPLES_MASK: rng.random(50) < 0.9,
    }
    streamed = {}
    for name, values in arrays.items():
        crcs = pointers.SegmentCrcs()
        for lo in range(0, values.size, 7):  # pieces that do not line up with the segments
            crcs.update(values[lo : lo + 7])
        streamed[name] = crcs.finish()
        np.testing.assert_array_equal(streamed[name][: values.size // 8], segment_crcs(values, values.size // 8))
    fresh = {name: segment_crcs(values, values.size // 8) for name, values in arrays.items()}
    for n in (0, 7, 8, 41, 50):
        assert state_digest(arrays, n, streamed) == state_digest(arrays, n, fresh)
    changed = dict(arrays, samples_mask=arrays[layout.SAMPLES_MASK].copy())
    changed[layout.SAMPLES_MASK][3] ^= True  # inside the first whole segment
    again = {name: segment_crcs(values, values.size // 8) for name, values in changed.items()}
    assert state_digest(changed, 41, again) != state_digest(arrays, 41, fresh)
    assert state_digest(changed, 2, again) == state_digest(arrays, 2, fresh)  # the change is past sample 2
