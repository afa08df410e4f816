"""PackedSamples: packing per-sample dicts, taking windows in any order, and splitting back."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dali_alchemi import FieldLevelError, PackedSamples, SampleDataError


def _samples() -> list[dict[str, object]]:
    return [
        {
            "positions": np.arange(6, dtype=np.float32).reshape(2, 3),
            "neighbor_list": np.array([[0, 1]]),
            "energy": np.array([1.0]),
        },
        {
            "positions": torch.full((3, 3), 7.0),  # tensors are accepted too
            "neighbor_list": np.array([[2, 0], [1, 2]]),
            "energy": 2.5,  # a 0-d system value counts as [1]
        },
    ]


def test_from_samples_concatenates_with_counts_and_levels() -> None:
    packed = PackedSamples.from_samples(_samples())
    assert packed.n_atoms.tolist() == [2, 3] and packed.n_edges.tolist() == [1, 2]
    assert packed.levels == {"positions": "atom", "neighbor_list": "edge", "energy": "system"}
    assert packed.fields["positions"].shape == (5, 3) and packed.fields["positions"].dtype == np.float32
    assert packed.fields["neighbor_list"].tolist() == [[0, 1], [2, 0], [1, 2]]  # kept sample-local
    assert packed.fields["energy"].tolist() == [1.0, 2.5]
    assert packed.atoms_ptr.tolist() == [0, 2, 5] and packed.edges_ptr.tolist() == [0, 1, 3]
    assert packed.logical_indices.tolist() == [0, 1]


def test_take_reorders_and_repeats_and_split_inverts() -> None:
    packed = PackedSamples.from_samples(_samples())
    taken = packed.take(np.array([1, 0, 1]))
    assert taken.n_atoms.tolist() == [3, 2, 3] and taken.logical_indices.tolist() == [1, 0, 1]
    assert taken.fields["neighbor_list"].tolist() == [[2, 0], [1, 2], [0, 1], [2, 0], [1, 2]]
    parts = taken.split()
    assert len(parts) == 3 and parts[1]["positions"].tolist() == np.arange(6).reshape(2, 3).tolist()
    assert parts[2]["energy"].shape == (1,)  # system rows get nvalchemi's leading 1 back
    again = PackedSamples.from_samples(parts)
    for name in packed.fields:
        np.testing.assert_array_equal(again.fields[name], taken.fields[name])


def test_inconsistent_samples_are_named() -> None:
    samples = _samples()
    with pytest.raises(SampleDataError, match=r"Sample 1 has fields \['energy', 'positions'\]"):
        PackedSamples.from_samples([samples[0], {"positions": np.zeros((1, 3)), "energy": 1.0}])
    with pytest.raises(SampleDataError, match="system level\\) has shape \\(2, 1\\)"):
        PackedSamples.from_samples([{**samples[0], "energy": np.zeros((2, 1))}])
    with pytest.raises(SampleDataError, match="different trailing shapes"):
        PackedSamples.from_samples([samples[0], {**samples[0], "positions": np.zeros((2, 2), np.float32)}])
    with pytest.raises(FieldLevelError, match="mystery"):
        PackedSamples.from_samples([{"mystery": np.zeros(3)}])
    assert PackedSamples.from_samples([{"mystery": np.zeros(3)}], levels={"mystery": "atom"}).n_atoms.tolist() == [3]
    with pytest.raises(ValueError, match="No samples given"):
        PackedSamples.from_samples([])
