"""A multi-store (part stores and a manifest) opened as one dataset: its manifest checked, its parts read in
order behind one index with no added fields, and parts that are not one dataset refused."""

from __future__ import annotations

import json
import pickle
import shutil
from pathlib import Path

import numpy as np
import pytest

from dali_alchemi import (
    AtomicDataZarrReader,
    AtomicDataZarrWriter,
    FieldMismatchError,
    PackedSamples,
    UnknownFieldError,
)
from dali_alchemi.bench.synth import synthetic_samples
from dali_alchemi.errors import ConfigError, NotAStoreError, StoreFormatError
from dali_alchemi.loader_inputs import open_source
from dali_alchemi.plan.arguments import PlanArguments, reader_plan
from dali_alchemi.plan.mixture import MixturePlan
from dali_alchemi.store.format.multistore import MANIFEST_NAME, is_multistore, read_manifest, write_manifest
from dali_alchemi.store.read.multi import MultiReader
from dali_alchemi.store.read.multistore import open_multistore


def _multistore(folder: Path, *stores: Path, complete: bool = True) -> Path:
    folder.mkdir()
    parts = []
    for k, store in enumerate(stores):
        shutil.copytree(store, folder / f"part-{k:05d}")
        parts.append({"name": f"part-{k:05d}", "done": True})
    write_manifest(folder, {"complete": complete, "options": {}, "inputs": [], "parts": parts})
    return folder


def test_the_parts_read_in_order_as_one_store(small_store: Path, other_store: Path, tmp_path: Path) -> None:
    path = _multistore(tmp_path / "m", small_store, other_store)
    assert is_multistore(path) and not is_multistore(small_store) and not is_multistore("http://host/m")
    reader, owned = open_source(str(path), fields=None, cache_bytes=None)
    with reader, AtomicDataZarrReader(small_store) as a, AtomicDataZarrReader(other_store) as b:
        assert owned and isinstance(reader, MultiReader) and reader.one_dataset and len(reader) == 420
        assert [m.cache_bytes for m in reader.members] == [1 << 29, 1 << 29]  # one dataset's budget, shared
        assert list(reader.field_specs) == list(a.field_specs)  # a store's fields: no dataset_id, dataset_index
        got = reader.read_packed([0, 299, 300, 419])
        want = [a.read_packed([0, 299]), b.read_packed([300 - 300, 119])]
        np.testing.assert_array_equal(got.fields["positions"], np.concatenate([w.fields["positions"] for w in want]))
        plan = reader_plan(None, PlanArguments(batch_size=10), reader, list(reader.field_specs), reader.sample_sizes)
        assert not isinstance(plan, MixturePlan) and plan.num_samples == 420
        copy = pickle.loads(pickle.dumps(reader))
        assert copy.one_dataset and "dataset_id" not in copy.field_specs
        copy.close()
        with pytest.raises(UnknownFieldError, match=r"Unknown fields \['dataset_id'\]: missing from dataset 0"):
            open_multistore(path, fields=("positions", "dataset_id"))
    with pytest.raises(ConfigError, match=r"shared_cache needs one store; .* is a multi-store of parts"):
        open_source(str(path), fields=None, cache_bytes=None, shared_cache=str(tmp_path / "cache"))


def test_a_store_reader_given_a_multistore_says_how_to_open_it(small_store: Path, tmp_path: Path) -> None:
    path = _multistore(tmp_path / "m", small_store)
    with pytest.raises(NotAStoreError, match=r"is a multi-store \(part stores and a manifest.*open_reader\(path\)"):
        AtomicDataZarrReader(path)


def test_an_unfinished_or_foreign_manifest_is_refused(small_store: Path, tmp_path: Path) -> None:
    path = _multistore(tmp_path / "m", small_store, complete=False)
    with pytest.raises(StoreFormatError, match=r"has not finished \(1 of 1 parts written\); run the same convert"):
        open_multistore(path)
    manifest = read_manifest(path)
    (path / MANIFEST_NAME).write_text(json.dumps({**manifest, "version": 99}))
    with pytest.raises(StoreFormatError, match="multi-store version 99; this dali-alchemi reads version 1: upgrade"):
        read_manifest(path)
    (path / MANIFEST_NAME).write_text("{not json")
    with pytest.raises(StoreFormatError, match="not a readable multi-store manifest"):
        read_manifest(path)
    (path / MANIFEST_NAME).write_text(json.dumps({"format": "other"}))
    with pytest.raises(StoreFormatError, match="not a multi-store manifest"):
        read_manifest(path)


def test_parts_with_other_fields_are_not_one_dataset(small_store: Path, tmp_path: Path) -> None:
    full = synthetic_samples(12, seed=3, min_atoms=10, max_atoms=40)
    fewer = {name: values for name, values in full.fields.items() if name != "forces"}
    lacking = tmp_path / "lacking.zarr"
    AtomicDataZarrWriter(lacking).write(
        PackedSamples.from_fields(fewer, {n: full.levels[n] for n in fewer}, full.n_atoms, full.n_edges)
    )
    path = _multistore(tmp_path / "m", small_store, lacking)
    with pytest.raises(
        FieldMismatchError, match=r"part part-00001 has fields \[.*\], part part-00000 has \[.*'forces'"
    ):
        open_multistore(path)
