from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dali_alchemi.interop.neighbors import image_offsets, radius_graph

ase_neighborlist = pytest.importorskip("ase.neighborlist")
ase = pytest.importorskip("ase")


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(1, 12),
    pbc=st.tuples(st.booleans(), st.booleans(), st.booleans()),
    skew=st.floats(-0.4, 0.4),
    cutoff=st.floats(1.0, 6.0),
    seed=st.integers(0, 1000),
)
def test_matches_ase_for_any_cell(n: int, pbc: tuple[bool, bool, bool], skew: float, cutoff: float, seed: int) -> None:
    rng = np.random.default_rng(seed)
    cell = np.diag(rng.uniform(2.5, 6.0, 3))
    cell[1, 0] = skew * cell[0, 0]  # triclinic
    cell[2, :2] = rng.uniform(-1, 1, 2)
    atoms = ase.Atoms(numbers=np.ones(n, int), positions=rng.uniform(0, 1, (n, 3)) @ cell, cell=cell, pbc=pbc)
    i, j, shifts = ase_neighborlist.neighbor_list("ijS", atoms, cutoff)
    edges, images = radius_graph(atoms.positions, cell, np.array(pbc), cutoff)
    theirs = sorted(map(tuple, np.column_stack([i, j, shifts]).tolist()))
    ours = sorted(map(tuple, np.column_stack([edges, images]).tolist()))
    assert ours == theirs
    vectors = atoms.positions[edges[:, 1]] + images @ cell - atoms.positions[edges[:, 0]]
    assert (np.linalg.norm(vectors, axis=1) < cutoff).all()


def test_molecules_and_edge_cases() -> None:
    positions = np.array([[0.0, 0, 0], [0.9, 0, 0], [5.0, 0, 0]])
    edges, images = radius_graph(positions, np.zeros((3, 3)), np.zeros(3, bool), 1.0)
    assert edges.tolist() == [[0, 1], [1, 0]] and not images.any()
    assert radius_graph(np.zeros((0, 3)), np.eye(3), np.ones(3, bool), 2.0)[0].shape == (0, 2)
    with pytest.raises(ValueError, match="non-zero volume along its periodic axes"):
        radius_graph(positions, np.zeros((3, 3)), np.ones(3, bool), 1.0)
    with pytest.raises(ValueError, match="cutoff must be a positive number"):
        radius_graph(positions, np.eye(3), np.ones(3, bool), -1.0)
    # a single atom in a small periodic box sees its own images
    edges, images = radius_graph(np.zeros((1, 3)), np.eye(3) * 2.0, np.ones(3, bool), 3.0)
    assert (
        len(edges) == 6 + 12
    )  # faces at 2.0, edges at 2.83; corners at 3.46 are out and set(map(tuple, np.abs(images).tolist())) >= {(1, 0, 0), (1, 1, 0)}
    assert image_offsets(np.eye(3), np.array([True, False, False]), 2.5).tolist()[0] == [0, 0, 0]


def test_pairs_just_inside_and_outside_the_cutoff_far_from_the_origin() -> None:
    # |t|^2 + |b|^2 - 2 b.t loses about 1e-4 A^2 to cancellation at 1e6 A; differences do not
    far = 1e6
    positions = np.array([[far, 0, 0], [far + 5.0 - 1e-6, 0, 0], [far, 5.0 + 1e-6, 0]])
    edges, _ = radius_graph(positions, np.zeros((3, 3)), np.zeros(3, bool), 5.0)
    assert edges.tolist() == [[0, 1], [1, 0]]


def test_image_atoms_outside_the_atoms_reach_are_skipped_without_losing_an_edge() -> None:
    # a big cell, atoms in one corner: most image atoms are beyond the grown bounding box
    rng = np.random.default_rng(7)
    cell = np.diag([8.0, 8.0, 8.0])
    positions = rng.uniform(0, 1.5, (10, 3))
    atoms = ase.Atoms(numbers=np.ones(10, int), positions=positions, cell=cell, pbc=True)
    i, j, shifts = ase_neighborlist.neighbor_list("ijS", atoms, 7.0)
    edges, images = radius_graph(positions, cell, np.ones(3, bool), 7.0)
    assert sorted(map(tuple, np.column_stack([edges, images]).tolist())) == sorted(
        map(tuple, np.column_stack([i, j, shifts]).tolist())
    )
    reached = {tuple(s) for s in images.tolist()}
    assert (-1, 0, 0) in reached and (1, 1, 1) not in reached  # 6.5 A away along x; 11 A away


def test_a_slab_with_an_empty_third_cell_vector() -> None:
    cell = np.array([[3.0, 0, 0], [0.5, 3.0, 0], [0, 0, 0]])
    pbc = np.array([True, True, False])
    positions = np.array([[0.0, 0, 0], [1.5, 1.5, 0.5], [0.2, 2.5, -1.0]])
    edges, images = radius_graph(positions, cell, pbc, 3.2)
    atoms = ase.Atoms(numbers=[1, 1, 1], positions=positions, cell=cell, pbc=pbc)
    i, j, shifts = ase_neighborlist.neighbor_list("ijS", atoms, 3.2)
    assert sorted(map(tuple, np.column_stack([edges, images]).tolist())) == sorted(
        map(tuple, np.column_stack([i, j, shifts]).tolist())
    )
    assert not images[:, 2].any()


@pytest.mark.timeout(60)  # a hang detector only: the refusal comes before any per-image allocation
@pytest.mark.parametrize(("side", "cutoff"), [(0.01, 5.0), (1e-3, 5.0), (1.0, 1e300)])
def test_a_cell_far_smaller_than_the_cutoff_is_refused_up_front(side: float, cutoff: float) -> None:
    from dali_alchemi.errors import SampleDataError

    with pytest.raises(SampleDataError, match=r"periodic images of this cell .* more than 1,048,576"):
        radius_graph(np.zeros((1, 3)), np.eye(3) * side, np.array([True, True, True]), cutoff)


def test_images_searched_a_group_at_a_time_give_the_same_sorted_edges(monkeypatch: pytest.MonkeyPatch) -> None:
    from dali_alchemi.interop import neighbors

    rng = np.random.default_rng(3)
    cell = np.diag([2.5, 3.0, 2.0])
    pos = rng.uniform(0, 1, (7, 3)) @ cell
    pbc = np.array([True, True, False])
    edges, images = radius_graph(pos, cell, pbc, 4.0)
    monkeypatch.setattr(neighbors, "BLOCK_BYTES", 24 * 7 * 3)  # three images per group, one row per block
    small_edges, small_images = radius_graph(pos, cell, pbc, 4.0)
    assert edges.shape[0] > 100 and np.array_equal(edges, small_edges) and np.array_equal(images, small_images)
    assert edges[:, 0].tolist() == sorted(edges[:, 0].tolist())  # sorted by sender, as one group gives them


def test_too_many_edges_are_refused_while_searching(monkeypatch: pytest.MonkeyPatch) -> None:
    from dali_alchemi.errors import SampleDataError
    from dali_alchemi.interop import neighbors

    monkeypatch.setattr(neighbors, "MAX_EDGES", 10)
    with pytest.raises(SampleDataError, match="more than 10 edges"):
        radius_graph(np.zeros((5, 3)), np.eye(3) * 10, np.array([False] * 3), 1.0)
