"""checked_indices: indices are checked as given, and never reshaped into other samples."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from dali_alchemi import AtomicDataZarrReader, AtomicDataZarrWriter, SampleIndexError
from dali_alchemi.bench.synth import synthetic_samples
from dali_alchemi.store.format.indices import checked_indices


def test_scalars_and_1d_sequences_are_indices() -> None:
    assert checked_indices(3, 10).tolist() == [3]
    assert checked_indices(np.int64(-1), 10).tolist() == [9]
    assert checked_indices([1, 2], 10).tolist() == [1, 2]


@pytest.mark.parametrize("shape", [(2, 2), (1, 3), (2, 1, 1)])
def test_an_array_of_more_than_one_dimension_is_refused_not_flattened(shape: tuple[int, ...]) -> None:
    with pytest.raises(SampleIndexError, match=rf"1-D sequence, got an array of shape \({shape[0]}, "):
        checked_indices(np.zeros(shape, np.int64), 10)


def test_the_reader_and_the_writer_refuse_a_2d_index(tmp_path: Path) -> None:
    path = tmp_path / "s.zarr"
    AtomicDataZarrWriter(path).write(synthetic_samples(6, seed=2))
    with pytest.raises(SampleIndexError, match="shape"):
        AtomicDataZarrReader(path).read_packed(np.array([[0, 1], [2, 3]]))
    with pytest.raises(SampleIndexError, match="shape"):
        AtomicDataZarrWriter(path).delete(np.array([[0, 1]]))
    assert len(AtomicDataZarrReader(path)) == 6
