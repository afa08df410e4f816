"""An open reader never mixes two states of a store that another process rewrites under it."""

from __future__ import annotations

import pickle
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from dali_alchemi import AtomicDataZarrReader, AtomicDataZarrWriter, MultiReader
from dali_alchemi.bench.synth import synthetic_samples, write_synthetic_store
from dali_alchemi.config import ArrayConfig, WriteConfig
from dali_alchemi.errors import StoreChangedError
from dali_alchemi.interop.nvalchemi_reader import NvalchemiDropInReader
from dali_alchemi.store.format.generation import read_token, writer_state

FIELDS = ["positions", "energy"]


@pytest.fixture()
def store(small_store: Path, tmp_path: Path) -> Path:
    """A private, writable copy of the shared small store."""
    return Path(shutil.copytree(small_store, tmp_path / "s.zarr"))


def _in_another_process(store: Path, code: str) -> None:
    """Run writer code on ``store`` in a separate Python process, as another job would."""
    script = "from dali_alchemi import AtomicDataZarrWriter\nw = AtomicDataZarrWriter(STORE)\n" + textwrap.dedent(code)
    subprocess.run([sys.executable, "-c", script.replace("STORE", repr(str(store)))], check=True, timeout=120)


def test_delete_and_defragment_in_another_process_raise_instead_of_returning_moved_rows(store: Path) -> None:
    with AtomicDataZarrReader(store, fields=FIELDS, cache_bytes=0) as reader:
        before = reader.read_packed([1, len(reader) - 1])
        _in_another_process(store, "w.delete([0, 5, 6])\nw.defragment()\n")
        assert len(reader) == 300  # the state it opened, until it notices
        with pytest.raises(StoreChangedError, match=r"changed under this reader: it now holds 297 physical samples"):
            reader.read_packed([1, len(reader) - 1])
        with pytest.raises(StoreChangedError, match=r"Call refresh\(\) on the reader"):
            reader.read_packed([2])  # and it keeps refusing: never a mix
        reader.refresh()
        after = reader.read_packed([0, len(reader) - 1])  # physical 1 is now 0; the last stays the last
    assert len(reader) == 297
    np.testing.assert_array_equal(after.fields["positions"], before.fields["positions"])
    np.testing.assert_array_equal(after.fields["energy"], before.fields["energy"])


def test_a_delete_alone_is_noticed_before_zeroed_rows_are_served(store: Path) -> None:
    with AtomicDataZarrReader(store, fields=FIELDS, cache_bytes=0) as reader:
        reader.read_packed([3])
        AtomicDataZarrWriter(store).delete([3, 4])
        with pytest.raises(StoreChangedError, match=r"2 of its samples were deleted \(physical 3, 4\)"):
            reader.read_packed([10])


def test_a_defragment_in_this_process_is_noticed_with_the_cache_on(store: Path) -> None:
    with AtomicDataZarrReader(store, fields=FIELDS) as reader:
        reader.read_packed(np.arange(300))  # everything cached
        writer = AtomicDataZarrWriter(store)
        writer.delete([0])
        writer.defragment()
        with pytest.raises(StoreChangedError):
            reader.read_packed([1])


def test_appends_keep_the_opened_state_exact(store: Path) -> None:
    with AtomicDataZarrReader(store, cache_bytes=0) as reader:
        before = reader.read_packed(np.arange(290, 300))
        token = read_token(reader._location)
        AtomicDataZarrWriter(store).append(synthetic_samples(20, seed=3, min_atoms=10, max_atoms=40))
        assert read_token(reader._location) != token  # the append was seen, and judged harmless
        again = reader.read_packed(np.arange(290, 300))
        assert len(reader) == 300
        for name, values in before.fields.items():
            np.testing.assert_array_equal(again.fields[name], values, err_msg=name)
        reader.refresh()
        assert len(reader) == 320


@pytest.mark.parametrize("cache_bytes", [0, 64 << 20], ids=["no-cache", "cache"])
@pytest.mark.parametrize(
    "config",
    [
        WriteConfig(core=ArrayConfig(chunk_size=64), meta=ArrayConfig(chunk_size=128)),
        WriteConfig(core=ArrayConfig(chunk_size=64, shard_size=256), meta=ArrayConfig(chunk_size=128, shard_size=256)),
        WriteConfig(core=ArrayConfig(chunk_size=64, shard_size=256, checksum=False), meta=ArrayConfig(chunk_size=128)),
    ],
    ids=["chunked", "sharded", "sharded-no-checksum"],
)
def test_a_read_after_an_append_returns_exactly_the_old_values(
    tmp_path: Path, config: WriteConfig, cache_bytes: int
) -> None:
    store = write_synthetic_store(tmp_path / "s.zarr", 300, seed=7, min_atoms=10, max_atoms=40, config=config)
    indices = np.arange(280, 300)  # the last shard and the last partial chunk, which the append rewrites
    with AtomicDataZarrReader(store, cache_bytes=cache_bytes) as reader:
        before = reader.read_packed(indices)
        AtomicDataZarrWriter(store).append(synthetic_samples(40, seed=3, min_atoms=10, max_atoms=40))
        again = reader.read_packed(indices)
        assert len(reader) == 300
        for name, values in before.fields.items():
            np.testing.assert_array_equal(again.fields[name], values, err_msg=name)
        np.testing.assert_array_equal(reader.read_packed(indices[::-1]).fields["energy"], before.fields["energy"][::-1])


def test_a_pickled_reader_refuses_a_store_deleted_from_since(store: Path) -> None:
    with AtomicDataZarrReader(store, fields=FIELDS, cache_bytes=0) as reader:
        blob = pickle.dumps(reader)
        AtomicDataZarrWriter(store).delete([0, 1, 2])
        with pytest.raises(StoreChangedError, match=r"changed since the reader this copy was made from opened it"):
            pickle.loads(blob)
        with pytest.raises(StoreChangedError, match=r"a MultiReader: open a new one"):
            reader.read_packed([5])


@pytest.mark.parametrize("kind", ["reader", "drop-in", "multi"])
def test_a_pickled_reader_serves_the_state_its_parent_served_when_the_store_only_grew(store: Path, kind: str) -> None:
    opened = AtomicDataZarrReader(store, cache_bytes=0) if kind != "drop-in" else NvalchemiDropInReader(store)
    parent = MultiReader([opened]) if kind == "multi" else opened
    with parent:
        AtomicDataZarrWriter(store).append(synthetic_samples(20, seed=3, min_atoms=10, max_atoms=40))
        before = parent.read_packed(np.arange(290, 300))  # the parent notices the append: still 300
        AtomicDataZarrWriter(store).append(synthetic_samples(20, seed=4, min_atoms=10, max_atoms=40))
        with pickle.loads(pickle.dumps(parent)) as copy:
            assert len(copy) == len(parent) == 300
            members = copy.members if isinstance(copy, MultiReader) else (copy,)
            assert isinstance(members[0], type(opened))
            np.testing.assert_array_equal(members[0].atoms_ptr, opened.atoms_ptr)  # type: ignore[attr-defined]
            assert members[0].field_names == opened.field_names  # type: ignore[attr-defined]
            again = copy.read_packed(np.arange(290, 300))
    assert set(again.fields) == set(before.fields)
    for name, values in before.fields.items():
        np.testing.assert_array_equal(again.fields[name], values, err_msg=name)
    opened.close()


def test_a_pickled_reader_refuses_a_replaced_field_it_reads(store: Path) -> None:
    writer = AtomicDataZarrWriter(store)
    writer.add_custom("tag", np.zeros(300, dtype=np.float32), "system")
    with AtomicDataZarrReader(store, cache_bytes=0) as reader:
        blob = pickle.dumps(reader)
        writer.add_custom("tag", np.ones(300, dtype=np.float32), "system")
        with pytest.raises(StoreChangedError, match=r"field 'tag' was replaced"):
            pickle.loads(blob)


def test_replacing_a_custom_field_is_noticed_only_by_readers_of_that_field(store: Path) -> None:
    writer = AtomicDataZarrWriter(store)
    writer.add_custom("charge_state", np.arange(300, dtype=np.float32), "system")
    with (
        AtomicDataZarrReader(store, fields=["charge_state"], cache_bytes=0) as reads_it,
        AtomicDataZarrReader(store, fields=["positions"], cache_bytes=0) as does_not,
    ):
        writer.add_custom("charge_state", -np.arange(300, dtype=np.float32), "system")
        with pytest.raises(StoreChangedError, match=r"field 'charge_state' was replaced \(add_custom, or repair\)"):
            reads_it.read_packed([7])
        does_not.read_packed([7])


def test_every_writer_operation_that_moves_rows_bumps_the_generation(store: Path) -> None:
    import zarr

    def state() -> tuple[int, dict[str, int]]:
        return writer_state(zarr.open_group(str(store), mode="r").attrs.asdict())

    writer = AtomicDataZarrWriter(store)
    assert state() == (0, {})  # a store as written: nothing recorded
    writer.delete([1])
    assert state() == (1, {})
    writer.add_custom("tag", np.zeros(300, np.float32), "system")
    assert state() == (2, {})  # a new custom field moves nothing
    writer.add_custom("tag", np.ones(300, np.float32), "system")
    assert state() == (3, {"tag": 3})
    writer.defragment()
    assert state() == (4, {"tag": 3})


@pytest.mark.dali
def test_a_loader_raises_when_the_store_is_defragmented_under_it(store: Path) -> None:
    from dali_alchemi import DALIDataLoader
    from dali_alchemi.errors import LoaderError

    with DALIDataLoader(
        store, batch_size=10, batches_per_window=1, shuffle=False, num_workers=0, device="cpu", cache_bytes=0,
        read_ahead=1, queue_depth=1,
    ) as loader:  # fmt: skip
        batches = iter(loader)
        next(batches)
        _in_another_process(store, "w.delete([250])\nw.defragment()\n")
        with pytest.raises(LoaderError, match=r"StoreChangedError: .* build a new loader") as raised:
            for _ in batches:
                pass
    assert raised.value.original_type == "StoreChangedError"
