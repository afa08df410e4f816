"""Both loaders resolve their inputs in one place: store -> reader -> fields -> plan -> pad shape."""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import pytest

from dali_alchemi import AtomicDataZarrReader, PlanError, ReaderClosedError, loader_inputs
from dali_alchemi.loader_inputs import resolve_inputs
from dali_alchemi.plan import PlanArguments

ROOT = Path(__file__).resolve().parents[1]


def test_a_store_resolves_to_its_reader_fields_plan_and_pad_shape(small_store: Path) -> None:
    arguments = PlanArguments(max_atoms=400, max_edges=20_000, pad=True, shuffle=False)
    inputs = resolve_inputs(small_store, plan=None, arguments=arguments, fields=("positions", "atomic_numbers"),
                            cache_bytes=None, loader="test")  # fmt: skip
    try:
        assert inputs.owns_reader and isinstance(inputs.reader, AtomicDataZarrReader)
        assert inputs.fields == ("positions", "atomic_numbers")
        assert inputs.pad_shape is not None and inputs.pad_shape.to_kwargs()["max_atoms"] == 400
        n_atoms, _ = inputs.sample_sizes()
        assert n_atoms.shape == (len(inputs.reader),) and int(n_atoms.min()) >= 10
        assert inputs.sample_sizes() is inputs.sample_sizes()  # computed once
        epoch = inputs.plan.epoch(0)
        assert np.array_equal(np.sort(epoch.order), np.arange(len(inputs.reader)))
    finally:
        inputs.close()
    with pytest.raises(ReaderClosedError):
        inputs.reader.read(0)


def test_plan_arguments_as_an_object_mean_what_the_keywords_mean(small_store: Path) -> None:
    arguments = PlanArguments(batch_size=7, shuffle=True, seed=3, drop_last=True)
    by_object = resolve_inputs(small_store, plan=arguments, arguments=PlanArguments(), fields=None,
                               cache_bytes=None, loader="test")  # fmt: skip
    by_keywords = resolve_inputs(small_store, plan=None, arguments=arguments, fields=None, cache_bytes=None,
                                 loader="test")  # fmt: skip
    try:
        a, b = by_object.plan.epoch(1), by_keywords.plan.epoch(1)
        assert np.array_equal(a.order, b.order) and np.array_equal(a.batch_ptr, b.batch_ptr)
    finally:
        by_object.close()
        by_keywords.close()


def test_plan_arguments_and_keywords_together_are_refused(small_store: Path) -> None:
    with pytest.raises(PlanError, match=r"plan=PlanArguments\(...\) is mutually exclusive with batch_size"):
        resolve_inputs(small_store, plan=PlanArguments(batch_size=8), arguments=PlanArguments(batch_size=4),
                       fields=None, cache_bytes=None, loader="test")  # fmt: skip


def test_a_failing_step_closes_the_reader_it_opened(small_store: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    closed: list[int] = []
    original = AtomicDataZarrReader.close
    monkeypatch.setattr(AtomicDataZarrReader, "close", lambda self: (closed.append(1), original(self))[1])
    with pytest.raises(PlanError):  # pad=True without budgets
        resolve_inputs(small_store, plan=None, arguments=PlanArguments(pad=True), fields=None, cache_bytes=None,
                       loader="test")  # fmt: skip
    assert closed == [1]


@pytest.mark.parametrize("module", ["dali_alchemi/pipeline/loader.py", "dali_alchemi/baseline/torch_loader.py"])
def test_the_core_loaders_do_not_import_interop(module: str) -> None:
    tree = ast.parse((ROOT / module).read_text())
    imported = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module}
    imported |= {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names}
    assert not {m for m in imported if m.startswith("dali_alchemi.interop")}


def test_estimates_read_the_sizes_of_an_even_sample_of_a_big_store_never_of_every_structure(
    small_store: Path, monkeypatch: pytest.MonkeyPatch
) -> None:

    asked: list[int] = []
    original = AtomicDataZarrReader.sample_sizes

    def counting(self: AtomicDataZarrReader, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        asked.append(len(indices))
        return original(self, indices)

    monkeypatch.setattr(AtomicDataZarrReader, "sample_sizes", counting)
    monkeypatch.setattr(loader_inputs, "SIZE_SAMPLE", 16)
    inputs = resolve_inputs(small_store, plan=None, arguments=PlanArguments(batch_size=8), fields=None,
                            cache_bytes=None, loader="test")  # fmt: skip
    try:
        n = len(inputs.reader)
        n_atoms, n_edges = inputs.size_sample()
        assert n > 16 and n_atoms.shape == (16,) and n_edges.shape == (16,)
        assert asked == [16]  # a plan without a budget needs no sizes; the estimate asked for 16
        whole_atoms, _ = original(inputs.reader, np.arange(n))
        picked = loader_inputs.evenly_spaced(n, 16)
        assert picked[0] == 0 and picked[-1] == n - 1 and np.all(np.diff(picked) > 0)
        assert np.array_equal(n_atoms, whole_atoms[picked])
    finally:
        inputs.close()
    assert np.array_equal(loader_inputs.evenly_spaced(5, 16), np.arange(5))


def test_the_size_sample_is_runs_of_consecutive_structures_spread_over_the_store() -> None:
    picked = loader_inputs.evenly_spaced(1_000_000, 1024, run=256)
    assert picked.dtype == np.int64 and picked.size == 1024 and np.all(np.diff(picked) > 0)
    runs = np.split(picked, np.flatnonzero(np.diff(picked) > 1) + 1)
    assert [r.size for r in runs] == [256] * 4
    assert [int(r[0]) for r in runs] == [0, 333_248, 666_496, 999_744] and picked[-1] == 999_999
    assert np.array_equal(loader_inputs.evenly_spaced(100, 64), np.r_[0:32, 68:100])  # two runs at the least
