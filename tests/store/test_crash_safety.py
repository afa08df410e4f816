"""Killing a writer at any moment leaves the store readable at its old or its new state.

Each trial copies a small store, forks a child that runs one write operation, and kills the child
with SIGKILL: either when the writer reports a given phase (every phase of every operation is hit),
or after a random delay within the operation's duration. The store must then read back exactly as
before or exactly as after the operation, and again after the next writer recovers it. The child
logs each phase it completes, so the random kills report which phases they interrupted.
"""

from __future__ import annotations

import multiprocessing
import os
import random
import shutil
import signal
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from dali_alchemi import AtomicDataZarrReader, AtomicDataZarrWriter, StoreNotFoundError
from dali_alchemi.bench.synth import synthetic_samples
from dali_alchemi.config import ArrayConfig, WriteConfig

CONFIG = WriteConfig(
    core=ArrayConfig(chunk_size=256), custom=ArrayConfig(chunk_size=256), meta=ArrayConfig(chunk_size=16)
)
BASE = synthetic_samples(40, seed=11, min_atoms=5, max_atoms=40)
EXTRA = synthetic_samples(12, seed=12, min_atoms=5, max_atoms=40)


def _prepare(path: Path, *, deleted: bool = False) -> None:
    writer = AtomicDataZarrWriter(path, CONFIG)
    writer.write(BASE)
    writer.add_custom("tag", np.arange(40, dtype=np.int32), "system")
    if deleted:
        writer.delete([0, 3, 17, 39])


def _op_append(writer: AtomicDataZarrWriter) -> None:
    samples = [dict(s, tag=np.array([100 + i], np.int32)) for i, s in enumerate(EXTRA.split())]
    writer.append(samples, levels={"tag": "system"})


def _op_delete(writer: AtomicDataZarrWriter) -> None:
    writer.delete([1, 5, 7, 30])


def _op_add_custom_new(writer: AtomicDataZarrWriter) -> None:
    atoms = int(BASE.n_atoms.sum())
    writer.add_custom("charge", np.linspace(-1, 1, atoms, dtype=np.float32), "atom")


def _op_add_custom_replace(writer: AtomicDataZarrWriter) -> None:
    writer.add_custom("tag", np.arange(40, dtype=np.int64) * 10, "system")


def _op_defragment(writer: AtomicDataZarrWriter) -> None:
    writer.defragment(window=7)


def _op_write(writer: AtomicDataZarrWriter) -> None:
    writer.write(BASE)


# name -> (operation, whether the base store has deleted samples, whether the store exists before)
OPERATIONS: dict[str, tuple[Callable[[AtomicDataZarrWriter], None], bool, bool]] = {
    "append": (_op_append, False, True),
    "delete": (_op_delete, False, True),
    "add_custom_new": (_op_add_custom_new, False, True),
    "add_custom_replace": (_op_add_custom_replace, False, True),
    "defragment": (_op_defragment, True, True),
    "write": (_op_write, False, False),
}
# What a reader sees when the writer is killed right after each phase, and after recovery.
# append and add_custom commit when their journal is cleared; a delete is visible from its journal on;
# defragment commits when the new directory is moved into place; write when it is renamed into place.
PHASES: dict[str, dict[str, tuple[str, str]]] = {
    "append": {
        "journal": ("old", "old"), "data": ("old", "old"), "masks": ("old", "old"), "pointers": ("old", "old"),
        "samples_mask": ("old", "old"), "attributes": ("old", "old"), "done": ("new", "new"),
    },
    "delete": {"journal": ("new", "new"), "samples_mask": ("new", "new"), "masks": ("new", "new"),
               "data": ("new", "new"), "done": ("new", "new")},
    "add_custom_new": {"journal": ("old", "old"), "staged": ("old", "old"), "moved-new": ("old", "old"),
                       "fields": ("old", "old"), "done": ("new", "new")},
    "add_custom_replace": {"journal": ("old", "old"), "staged": ("old", "old"), "moved-previous": ("old", "old"),
                           "moved-new": ("old", "old"), "fields": ("old", "old"), "done": ("new", "new")},
    "defragment": {"copied-window": ("old", "old"), "staged": ("old", "old"), "journal": ("old", "old"), "retired": ("new", "new"),
                   "swapped": ("new", "new"), "done": ("new", "new")},
    "write": {"staged": ("old", "old"), "done": ("new", "new")},
}  # fmt: skip


def _content(path: Path) -> dict[str, Any] | None:
    """Everything a reader sees: per logical sample, every field; ``None`` when there is no store."""
    try:
        reader = AtomicDataZarrReader(path, cache_bytes=0)
    except StoreNotFoundError:
        return None
    with reader:
        packed = reader.read_packed(np.arange(len(reader)))
        # physical indices tell a defragmented store from the same samples before compaction
        content: dict[str, Any] = {
            "n_atoms": packed.n_atoms,
            "n_edges": packed.n_edges,
            "physical": packed.physical_indices,
        }
        content.update({f"field:{k}": v for k, v in packed.fields.items()})
        return content


def _same(a: dict[str, Any] | None, b: dict[str, Any] | None) -> bool:
    if a is None or b is None:
        return a is b
    return a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


def _child(path: str, op: str, kill_at: str | None, log: str) -> None:
    writer = AtomicDataZarrWriter(path, CONFIG)

    def on_phase(phase: str) -> None:
        with open(log, "a") as fh:
            fh.write(phase + "\n")
        if phase == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)

    writer.on_phase = on_phase
    OPERATIONS[op][0](writer)
    os._exit(0)


def _run_child(path: Path, op: str, *, kill_at: str | None = None, kill_after: float | None = None) -> list[str]:
    log = path.parent / f"{path.name}.phases"
    log.unlink(missing_ok=True)
    proc = multiprocessing.get_context("fork").Process(target=_child, args=(str(path), op, kill_at, str(log)))
    proc.start()
    if kill_after is not None:
        time.sleep(kill_after)
        if proc.is_alive():
            os.kill(proc.pid, signal.SIGKILL)  # type: ignore[arg-type]
    proc.join(60)
    assert proc.exitcode is not None, "the writer child did not finish"
    return log.read_text().split() if log.exists() else []


class Scenario:
    """A base store for one operation, with the content before and after it."""

    def __init__(self, root: Path, op: str) -> None:
        self.root, self.op = root, op
        _, deleted, exists = OPERATIONS[op]
        self.base = root / "base" / "store.zarr"
        if exists:
            _prepare(self.base, deleted=deleted)
        self.old = _content(self.base)
        after = self.fresh("after")
        started = time.perf_counter()
        assert _run_child(after, op)[-1] == "done"
        self.duration = time.perf_counter() - started
        self.new = _content(after)
        assert not _same(self.old, self.new)

    def fresh(self, name: str) -> Path:
        target = self.root / name / "store.zarr"
        shutil.rmtree(target.parent, ignore_errors=True)
        target.parent.mkdir(parents=True)
        if self.base.exists():
            shutil.copytree(self.base, target)
        return target

    def check(self, path: Path, when: str) -> str:
        seen = _content(path)
        if _same(seen, self.old):
            state = "old"
        elif _same(seen, self.new):
            state = "new"
        else:
            raise AssertionError(f"{self.op}: {when}, the store reads neither its old nor its new state")
        return state

    def check_after_recovery(self, path: Path) -> str:
        AtomicDataZarrWriter(path, CONFIG).recover()
        state = self.check(path, "after recovery")
        leftovers = [p.name for p in path.parent.iterdir() if p.name != path.name and not p.name.endswith(".phases")]
        assert not leftovers, f"{self.op}: recovery left {leftovers} beside the store"
        if path.exists():  # the recovered store takes writes again
            AtomicDataZarrWriter(path, CONFIG).delete([0])
        return state


@pytest.mark.timeout(600)
@pytest.mark.parametrize("op", list(OPERATIONS))
def test_a_writer_killed_at_every_phase_leaves_old_or_new(op: str, tmp_path: Path) -> None:
    scenario = Scenario(tmp_path, op)
    for phase, (expected, recovered) in PHASES[op].items():
        trial = scenario.fresh(f"phase-{phase}")
        reached = _run_child(trial, op, kill_at=phase)
        assert reached[-1] == phase, f"{op}: the writer never reported phase {phase!r} (it reported {reached})"
        assert scenario.check(trial, f"killed after {phase}") == expected, (op, phase)
        assert scenario.check_after_recovery(trial) == recovered, (op, phase)


@pytest.mark.stress
@pytest.mark.timeout(1800)
@pytest.mark.parametrize("op", ["append", "delete", "add_custom_replace", "defragment"])
def test_a_writer_killed_at_random_moments_leaves_old_or_new(op: str, tmp_path: Path) -> None:
    """Kills at random moments, aimed by what the last kill interrupted, until 16 kills have landed and at
    least two phases were interrupted: however busy the machine, kills then fall inside the operation."""
    scenario = Scenario(tmp_path, op)
    rng = random.Random(op)
    interrupted: Counter[str] = Counter()
    aim = scenario.duration
    for k in range(64):
        if k >= 16 and len(interrupted) >= 2:
            break
        trial = scenario.fresh(f"random-{k}")
        reached = _run_child(trial, op, kill_after=rng.uniform(0, aim * 1.1))
        interrupted[reached[-1] if reached else "start"] += 1
        if not reached:  # killed before the first phase: aim later next time
            aim *= 1.3
        elif reached[-1] == "done":  # finished first: aim earlier
            aim /= 1.3
        scenario.check(trial, f"killed after {reached}")
        scenario.check_after_recovery(trial)
    assert len(interrupted) >= 2, f"{op}: random kills only interrupted {dict(interrupted)}"
    print(f"{op}: random kills interrupted after {dict(interrupted)}")


def test_an_open_reader_keeps_its_snapshot_during_an_append(tmp_path: Path) -> None:
    scenario = Scenario(tmp_path, "append")
    path = scenario.fresh("snapshot")
    reader = AtomicDataZarrReader(path)
    before = reader.read_packed(np.arange(len(reader)))
    assert _run_child(path, "append")[-1] == "done"  # another process appends
    during = reader.read_packed(np.arange(len(reader)))
    for name, values in before.fields.items():
        assert np.array_equal(during.fields[name], values), name
    reader.refresh()
    assert len(reader) == 40 + 12
    assert _same(_content(path), scenario.new)
    reader.close()
