"""Contract tests for :class:`~dali_alchemi.store.format.protocol.PackedReader` implementations.

Subclass :class:`PackedReaderTests` in a pytest module and implement two fixtures' worth of methods:
:meth:`~PackedReaderTests.make_reader` (a reader to test) and :meth:`~PackedReaderTests.expected`
(the samples it must return, as one :class:`~dali_alchemi.store.format.packed.PackedSamples` in index
order). The tests check sizes, field specs, packed reads in any order with duplicates, narrowing to
fields, counts read without data, picklability (the DALI loader sends readers to worker processes)
and closing. Like zarr-python's ``testing/store.py``, the contract lives in the package so that
other implementations can use it.
"""

from __future__ import annotations

import pickle
from typing import TYPE_CHECKING, Any

import numpy as np
import pytest

from dali_alchemi.store.format.protocol import PackedReader

if TYPE_CHECKING:
    from dali_alchemi.store.format.packed import PackedSamples

__all__ = ["PackedReaderTests"]


class PackedReaderTests:
    """The contract; a subclass provides :meth:`make_reader` and :meth:`expected`."""

    def make_reader(self) -> PackedReader:
        """A fresh reader under test (closed by the tests that need it closed)."""
        raise NotImplementedError

    def expected(self) -> PackedSamples:
        """Every structure the reader holds, in index order, with sample-local atom indices."""
        raise NotImplementedError

    @pytest.fixture()
    def subject(self) -> Any:
        reader = self.make_reader()
        yield reader
        reader.close()

    @staticmethod
    def assert_packed_equal(got: PackedSamples, want: PackedSamples) -> None:
        assert got.n_atoms.tolist() == want.n_atoms.tolist()
        assert got.n_edges.tolist() == want.n_edges.tolist()
        assert got.logical_indices.tolist() == want.logical_indices.tolist()
        assert set(got.fields) == set(want.fields)
        for name, values in want.fields.items():
            assert got.fields[name].dtype == values.dtype, name
            assert got.fields[name].shape == values.shape, name
            np.testing.assert_array_equal(got.fields[name], values, err_msg=name)
            assert got.levels[name] == want.levels[name], name

    def test_is_a_packed_reader(self, subject: PackedReader) -> None:
        assert isinstance(subject, PackedReader)

    def test_length_and_field_specs(self, subject: PackedReader) -> None:
        want = self.expected()
        assert len(subject) == len(want)
        specs = subject.field_specs
        assert set(specs) == set(want.fields)
        for name, values in want.fields.items():
            assert specs[name].level == want.levels[name], name
            assert specs[name].dtype == values.dtype, name
            assert specs[name].trailing == values.shape[1:], name

    def test_sample_sizes_without_reading(self, subject: PackedReader) -> None:
        want = self.expected()
        indices = np.arange(len(want), dtype=np.int64)[::-1]
        n_atoms, n_edges = subject.sample_sizes(indices)
        assert n_atoms.dtype == np.int64 and n_edges.dtype == np.int64
        assert n_atoms.tolist() == want.n_atoms[indices].tolist()
        assert n_edges.tolist() == want.n_edges[indices].tolist()

    def test_packed_read_in_request_order_with_duplicates(self, subject: PackedReader) -> None:
        want = self.expected()
        n = len(want)
        order = np.random.default_rng(0).permutation(n).astype(np.int64)
        order = np.concatenate([order[: max(1, n // 2)], order[:3]])  # repeats too
        self.assert_packed_equal(subject.read_packed(order), want.take(order))

    def test_packed_read_of_some_fields(self, subject: PackedReader) -> None:
        want = self.expected()
        name = sorted(want.fields)[0]
        got = subject.read_packed(np.array([0], dtype=np.int64), fields=[name])
        assert list(got.fields) == [name]
        np.testing.assert_array_equal(got.fields[name], want.take(np.array([0])).fields[name])

    def test_pickles_as_a_working_reader(self, subject: PackedReader) -> None:
        clone = pickle.loads(pickle.dumps(subject))
        try:
            indices = np.arange(min(5, len(subject)), dtype=np.int64)
            self.assert_packed_equal(clone.read_packed(indices), subject.read_packed(indices))
        finally:
            clone.close()

    def test_close_is_idempotent(self) -> None:
        reader = self.make_reader()
        reader.close()
        reader.close()
