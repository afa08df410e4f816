"""The one warning a shuffled loader gives for a store whose layout and cache do not fit each other."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest

from dali_alchemi import plain_dataloader
from dali_alchemi.bench.synth import write_synthetic_store
from dali_alchemi.config import layout_config
from dali_alchemi.errors import SlowLayoutWarning
from dali_alchemi.store.read.advice import slow_layout_advice
from dali_alchemi.store.read.reader import AtomicDataZarrReader

N = 2500  # about 140,000 atoms: positions, forces and velocities reach 1.6 MiB each


@pytest.fixture(scope="module")
def stores(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("advice")
    return {
        name: write_synthetic_store(root / f"{name}.zarr", N, config=layout_config(name))
        for name in ("compressed", "default")
    }


def test_large_compressed_blocks_over_a_small_cache_get_advice(stores: dict[str, Path]) -> None:
    with AtomicDataZarrReader(stores["compressed"], cache_bytes=1 << 20) as reader:
        advice = slow_layout_advice(reader)
        blocks = reader.decoded_block_bytes()
    assert advice is not None
    assert "dali-alchemi rewrite SRC DST" in advice and "x the reader's cache (1 MiB)" in advice
    assert set(blocks) == set(reader.field_specs)  # every array of this layout is decoded
    assert max(blocks.values()) >= 1 << 20


def test_no_advice_for_the_default_layout_or_a_cache_that_holds_the_store(stores: dict[str, Path]) -> None:
    with AtomicDataZarrReader(stores["default"], cache_bytes=1 << 20) as reader:
        assert slow_layout_advice(reader) is None
        decoded = reader.decoded_block_bytes()
    # float arrays are read in place (at this cache), the others decode blocks of at most 128 KiB
    assert "positions" not in decoded and "atomic_numbers" in decoded
    assert max(decoded.values()) <= 128 << 10
    with AtomicDataZarrReader(stores["compressed"]) as reader:  # the default 1 GiB cache holds it
        assert slow_layout_advice(reader) is None


def test_a_shuffled_loader_warns_once_per_store_and_a_sequential_one_not_at_all(stores: dict[str, Path]) -> None:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        plain_dataloader(stores["compressed"], batch_size=8, shuffle=False, cache_bytes=1 << 20)
        assert not [w for w in caught if issubclass(w.category, SlowLayoutWarning)]
        for _ in range(2):
            plain_dataloader(stores["compressed"], batch_size=8, shuffle=True, cache_bytes=1 << 20)
    slow = [w for w in caught if issubclass(w.category, SlowLayoutWarning)]
    assert len(slow) == 1
    assert str(slow[0].message).startswith("plain_dataloader: this store")
