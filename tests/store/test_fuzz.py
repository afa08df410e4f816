"""Mutated stores: opening and reading either succeeds with the data the store holds, or raises
StoreFormatError / IndexError (ReadTooLargeError, a MemoryError, when a pointer claims more rows than
memory holds). Nothing else, and never a crash.

The oracle is a deliberately naive reader written with zarr alone (whole arrays, per-sample slices).
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zarr
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dali_alchemi import (
    AtomicDataZarrReader,
    AtomicDataZarrWriter,
    ChunkDecodeError,
    ReadTooLargeError,
    StoreFormatError,
)
from dali_alchemi.bench.synth import synthetic_samples
from dali_alchemi.config import ArrayConfig, WriteConfig
from dali_alchemi.store.format.layout import default_level
from dali_alchemi.types import LEVELS

N = 24


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("fuzz") / "store.zarr"
    config = WriteConfig(core=ArrayConfig(chunk_size=64), meta=ArrayConfig(chunk_size=16))
    AtomicDataZarrWriter(path, config).write(synthetic_samples(N, seed=21, min_atoms=3, max_atoms=12))
    return path


def _naive(path: Path) -> dict[str, np.ndarray]:
    """What the store says, read with zarr and Python loops (slow, obviously correct)."""
    root = zarr.open_group(path, mode="r")
    atoms, edges = root["meta/atoms_ptr"][...], root["meta/edges_ptr"][...]
    live = np.flatnonzero(root["meta/samples_mask"][...])
    recorded = root.attrs.asdict().get("fields", {}).get("core", {})
    levels = {
        name: recorded.get(name) or default_level(name)
        for name in root["core"].array_keys()
        if name not in recorded or recorded[name] in LEVELS  # a level the reader cannot interpret is left out
    }
    out: dict[str, np.ndarray] = {}
    for name, level in levels.items():
        arr = root[f"core/{name}"][...]
        parts = []
        for p in live:
            if level == "system":
                parts.append(arr[p : p + 1])
            else:
                ptr = atoms if level == "atom" else edges
                part = arr[ptr[p] : ptr[p + 1]]
                parts.append(part - atoms[p] if name == "neighbor_list" else part)
        out[name] = np.concatenate(parts) if parts else arr[:0]
    return out


def _rewrite(path: Path, name: str, values: np.ndarray) -> None:
    group_name, array_name = name.split("/")
    group = zarr.open_group(path / group_name, mode="r+")
    chunks = group[array_name].chunks
    del group[array_name]
    group.create_array(array_name, shape=values.shape, dtype=values.dtype, chunks=chunks)[...] = values


def _mutate(path: Path, kind: str, data: st.DataObject) -> None:
    root = zarr.open_group(path, mode="r")
    if kind == "pointer":
        name = data.draw(st.sampled_from(["meta/atoms_ptr", "meta/edges_ptr"]))
        ptr = root[name][...]
        i = data.draw(st.integers(0, ptr.size - 1))
        ptr[i] = data.draw(st.one_of(st.integers(-3, int(ptr[-1]) + 3), st.just(10**12), st.just(-(2**62))))
        _rewrite(path, name, ptr)
    elif kind == "mask":
        mask = root["meta/samples_mask"][...]
        flips = data.draw(st.lists(st.integers(0, N - 1), min_size=1, max_size=6))
        mask[flips] = ~mask[flips]
        _rewrite(path, "meta/samples_mask", mask)
    elif kind == "attributes":
        doc = json.loads((path / "zarr.json").read_text())
        attrs = doc["attributes"]
        how = data.draw(st.sampled_from(["num_samples", "level", "drop_fields", "fields_type", "truncate"]))
        if how == "num_samples":
            attrs["num_samples"] = data.draw(st.one_of(st.integers(-2, 2 * N), st.text(max_size=3), st.none()))
        elif how == "level":
            field = data.draw(st.sampled_from(sorted(attrs["fields"]["core"])))
            attrs["fields"]["core"][field] = data.draw(st.sampled_from(["atom", "edge", "system", "node", "", 7]))
        elif how == "drop_fields":
            del attrs["fields"]
        elif how == "fields_type":
            attrs["fields"] = data.draw(st.sampled_from([[], "core", None, {"core": []}]))
        text = json.dumps(doc)
        if how == "truncate":
            text = text[: data.draw(st.integers(0, len(text) - 1))]
        (path / "zarr.json").write_text(text)
    else:  # chunk bytes
        chunks = sorted(p for p in path.rglob("*") if p.is_file() and p.parent.name != "" and "/c/" in str(p))
        chunk = data.draw(st.sampled_from(chunks))
        raw = bytearray(chunk.read_bytes())
        how = data.draw(st.sampled_from(["flip", "truncate", "empty", "garbage"]))
        if how == "flip" and raw:
            for pos in data.draw(st.lists(st.integers(0, len(raw) - 1), min_size=1, max_size=8)):
                raw[pos] ^= 0xFF
        elif how == "truncate":
            raw = raw[: data.draw(st.integers(0, max(0, len(raw) - 1)))]
        elif how == "empty":
            raw = bytearray()
        else:
            raw = bytearray(data.draw(st.binary(min_size=1, max_size=64)))
        chunk.write_bytes(bytes(raw))


MUTATIONS = st.sampled_from(["pointer", "mask", "attributes", "chunk"])
FUZZ = {"deadline": None, "suppress_health_check": [HealthCheck.too_slow, HealthCheck.function_scoped_fixture]}


def _read_correctly_or_fail_cleanly(pristine: Path, kind: str, data: st.DataObject) -> None:
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "store.zarr"
        shutil.copytree(pristine, path)
        _mutate(path, kind, data)
        try:
            with AtomicDataZarrReader(path, cache_bytes=0) as reader:
                packed = reader.read_packed(np.arange(len(reader)))
                single: Any = reader.read(-1)[0] if len(reader) else None
        except (StoreFormatError, IndexError, ReadTooLargeError):
            return
        expected = _naive(path)  # our reader succeeded, so the store must be what it says
        assert set(packed.fields) == set(expected)
        for name, values in expected.items():
            assert np.array_equal(packed.fields[name], values), (kind, name)
        if single is not None and "positions" in expected:  # a field of an unknown level is left out
            assert np.array_equal(single["positions"].numpy(), expected["positions"][-single["positions"].shape[0] :])


# Random draws: every chunk of the store carries a crc32c checksum, so a chunk cut short, emptied or
# flipped fails to decode instead of decoding to garbage (a truncated meta chunk once decoded through
# blosc "successfully"); a fresh draw each run finds what a fixed one would miss. `make test` draws a
# few dozen, `make stress` a couple of thousand.
@settings(max_examples=40, **FUZZ)
@given(kind=MUTATIONS, data=st.data())
def test_mutated_stores_read_correctly_or_fail_cleanly(pristine: Path, kind: str, data: st.DataObject) -> None:
    _read_correctly_or_fail_cleanly(pristine, kind, data)


@pytest.mark.stress
@pytest.mark.timeout(1800)
@settings(max_examples=2000, **FUZZ)
@given(kind=MUTATIONS, data=st.data())
def test_many_mutated_stores_read_correctly_or_fail_cleanly(pristine: Path, kind: str, data: st.DataObject) -> None:
    _read_correctly_or_fail_cleanly(pristine, kind, data)


def test_a_store_claiming_a_trillion_atoms_fails_before_allocating(pristine: Path, tmp_path: Path) -> None:
    path = tmp_path / "huge.zarr"
    shutil.copytree(pristine, path)
    root = zarr.open_group(path, mode="r+")
    atoms = root["meta/atoms_ptr"][...]
    atoms[1:] += 10**12  # sample 0 now claims a trillion atoms; the arrays' metadata agree
    _rewrite(path, "meta/atoms_ptr", atoms)
    total = int(atoms[-1])
    for name in ("meta/atoms_mask", "core/positions", "core/atomic_numbers", "core/forces", "core/velocities",
                 "core/atomic_masses", "core/atom_categories"):  # fmt: skip
        doc_path = path / name / "zarr.json"
        doc = json.loads(doc_path.read_text())
        doc["shape"][0] = total
        doc_path.write_text(json.dumps(doc))
    with AtomicDataZarrReader(path) as reader:  # opening reads only the pointers
        assert len(reader) == N
        # sample 1's rows now lie past the chunks written; the store promises every chunk, so not zeros
        with pytest.raises(ChunkDecodeError, match=r"chunk 'core/positions/c/\d+/0' is missing"):
            reader.read_packed([1], fields=["positions"])
        with pytest.raises(ReadTooLargeError, match=r"sample 0 \(physical 0\), claims 1,000,000,000,\d+ atoms"):
            reader.read(0)


def test_a_store_claiming_a_trillion_samples_fails_at_open(pristine: Path, tmp_path: Path) -> None:
    path = tmp_path / "many.zarr"
    shutil.copytree(pristine, path)
    for name, extra in (("samples_mask", 0), ("atoms_ptr", 1), ("edges_ptr", 1)):
        doc_path = path / "meta" / name / "zarr.json"
        doc = json.loads(doc_path.read_text())
        doc["shape"][0] = 10**12 + extra
        doc_path.write_text(json.dumps(doc))
    with pytest.raises(StoreFormatError, match="claims 1,000,000,000,000 samples"):
        AtomicDataZarrReader(path)


def test_chunks_too_large_to_decode_are_refused_at_open(pristine: Path, tmp_path: Path) -> None:
    path = tmp_path / "bigchunk.zarr"
    shutil.copytree(pristine, path)
    doc_path = path / "core" / "positions" / "zarr.json"
    doc = json.loads(doc_path.read_text())
    doc["chunk_grid"]["configuration"]["chunk_shape"][0] = 10**13
    doc_path.write_text(json.dumps(doc))
    with pytest.raises(StoreFormatError, match=r"core/positions has chunks of shape \(10000000000000, 3\)"):
        AtomicDataZarrReader(path)
