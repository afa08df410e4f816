"""Readers while a writer works on the same store: every read is one state written, or StoreChangedError.

Each structure carries a unique ``tag`` (a custom system field), and the truth holds what was written
under each tag; a read is correct when every structure it returns is exactly the one written under its
tag (never zeroed by a delete, never another structure's rows after a defragment, never half of an
append). A writer thread appends, deletes and defragments while reader threads read; the stress
variant does the same with the writer in another process, for longer.
"""

from __future__ import annotations

import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from dali_alchemi import AtomicDataZarrReader, AtomicDataZarrWriter, StoreChangedError
from dali_alchemi.bench.synth import synthetic_samples
from dali_alchemi.config import ArrayConfig, WriteConfig
from dali_alchemi.store.format.packed import PackedSamples
from tests.processes import HANG_S

CONFIG = WriteConfig(core=ArrayConfig(chunk_size=32), custom=ArrayConfig(chunk_size=8), meta=ArrayConfig(chunk_size=8))
FIRST = 24
BATCH = 6


def _batch(first_tag: int, n: int, seed: int) -> list[dict[str, np.ndarray]]:
    samples = synthetic_samples(n, seed=seed, min_atoms=2, max_atoms=7).split()
    return [dict(s, tag=np.array([first_tag + i], np.int64)) for i, s in enumerate(samples)]


def _truth(batches: int) -> dict[int, dict[str, np.ndarray]]:
    """What was written under each tag: the first structures, then ``batches`` appended batches."""
    written = _batch(0, FIRST, seed=1)
    for k in range(batches):
        written += _batch(FIRST + k * BATCH, BATCH, seed=2 + k)
    return {int(s["tag"][0]): s for s in written}


def _make_store(path: Path) -> Path:
    AtomicDataZarrWriter(path, CONFIG).write(_batch(0, FIRST, seed=1), levels={"tag": "system"}, custom=["tag"])
    return path


def _check(packed: PackedSamples, truth: dict[int, dict[str, np.ndarray]]) -> None:
    """Every structure read is exactly the one written under its tag, and no tag comes twice."""
    tags = packed.fields["tag"].reshape(-1).tolist()
    assert len(set(tags)) == len(tags), f"a structure read twice: {tags}"
    for tag, sample in zip(tags, packed.split(), strict=True):
        assert tag in truth, f"tag {tag} was never written (zeroed or foreign rows)"
        for name, values in truth[tag].items():
            assert np.array_equal(np.asarray(sample[name]), values), f"structure {tag}: field {name} differs"


def _writer_ops(path: Path, batches: int) -> None:
    """Appends, deletes and defragments, one after another."""
    writer = AtomicDataZarrWriter(path, CONFIG)
    for k in range(batches):
        writer.append(_batch(FIRST + k * BATCH, BATCH, seed=2 + k), levels={"tag": "system"})
        writer.delete([k * 3, k * 3 + 1])
        if k % 3 == 2 or k == batches - 1:
            writer.defragment()


def _read_while(done: threading.Event, path: Path, truth: dict[int, dict[str, np.ndarray]]) -> Callable[[], None]:
    def loop() -> None:
        reads = 0
        with AtomicDataZarrReader(path, cache_bytes=1 << 20) as reader:
            while not done.is_set() or reads < 3:
                try:
                    packed = reader.read_packed(np.arange(len(reader)))
                except StoreChangedError as err:
                    assert "refresh()" in str(err)
                    reader.refresh()
                    continue
                _check(packed, truth)
                reads += 1
                if reads % 3 == 0:
                    reader.refresh()

    return loop


def _run_readers(path: Path, truth: dict[int, dict[str, np.ndarray]], writer: Callable[[], None]) -> None:
    done = threading.Event()
    failures: list[BaseException] = []

    def guarded(body: Callable[[], None]) -> Callable[[], None]:
        def run() -> None:
            try:
                body()
            except BaseException as err:  # reported to the test's thread
                failures.append(err)
            finally:
                if body is writer:
                    done.set()

        return run

    threads = [threading.Thread(target=guarded(_read_while(done, path, truth))) for _ in range(2)]
    threads.append(threading.Thread(target=guarded(writer)))
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(HANG_S)
        assert not thread.is_alive(), "a reader or the writer hung"
    if failures:
        raise failures[0]


def test_readers_in_threads_see_whole_states_while_a_writer_appends_deletes_and_defragments(tmp_path: Path) -> None:
    path = _make_store(tmp_path / "s.zarr")
    batches = 1
    _run_readers(path, _truth(batches), lambda: _writer_ops(path, batches))
    with AtomicDataZarrReader(path) as reader:  # and the end state is what the writer did
        packed = reader.read_packed(np.arange(len(reader)))
    _check(packed, _truth(batches))
    assert len(packed) == FIRST + batches * BATCH - 2 * batches


WRITER = """
import sys
from pathlib import Path
from tests.store.test_concurrent_reads import _writer_ops
_writer_ops(Path(sys.argv[1]), int(sys.argv[2]))
"""


@pytest.mark.stress
def test_readers_see_whole_states_while_a_writer_process_works(tmp_path: Path) -> None:
    path = _make_store(tmp_path / "s.zarr")
    batches = 12

    def writer() -> None:
        subprocess.run(
            [sys.executable, "-c", WRITER, str(path), str(batches)],
            check=True, timeout=HANG_S * 10, cwd=Path(__file__).resolve().parents[2],
        )  # fmt: skip

    _run_readers(path, _truth(batches), writer)
