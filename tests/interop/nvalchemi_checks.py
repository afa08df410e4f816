"""Checks that two ``nvalchemi.data.Batch`` objects are the same, field by field and method by method."""

from __future__ import annotations

from typing import Any

import torch

DERIVED = ("batch_idx", "batch_ptr", "edge_ptr", "num_nodes_per_graph", "num_edges_per_graph")


def _same_tensors(a: dict[str, Any], b: dict[str, Any], what: str, *, key_order: bool) -> None:
    if key_order:
        assert list(a) == list(b), what
    assert sorted(a) == sorted(b), what
    for name, value in b.items():
        if isinstance(value, torch.Tensor):
            got = a[name]
            assert got.dtype == value.dtype and got.device == value.device, f"{what}: {name}"
            assert got.shape == value.shape and torch.equal(got, value), f"{what}: {name}"


def assert_same_nvalchemi_batch(ours: Any, theirs: Any, *, key_order: bool = False) -> None:
    """Every field (dtype, device, values), the derived pointers and counts, and the methods' results."""
    assert type(ours) is type(theirs)
    assert ours.device == theirs.device
    _same_tensors(ours.to_dict(), theirs.to_dict(), "to_dict", key_order=key_order)
    for name in DERIVED:
        a, b = getattr(ours, name), getattr(theirs, name)
        assert a.dtype == b.dtype and torch.equal(a, b), name
    assert ours.num_nodes_list == theirs.num_nodes_list and ours.num_edges_list == theirs.num_edges_list
    assert (ours.num_graphs, ours.num_nodes, ours.num_edges) == (theirs.num_graphs, theirs.num_nodes, theirs.num_edges)
    assert ours.keys == theirs.keys
    n = theirs.num_graphs
    for i in (0, n - 1):
        assert ours[i] == theirs[i], i  # one AtomicData, local neighbor indices
    assert [a == b for a, b in zip(ours.to_data_list(), theirs.to_data_list(), strict=True)] == [True] * n
    picked = [n - 1, 0] if n > 1 else [0]
    _same_tensors(
        ours.index_select(picked).to_dict(), theirs.index_select(picked).to_dict(), "index_select", key_order=False
    )
    _same_tensors(ours[picked].to_dict(), theirs[picked].to_dict(), "batch[list]", key_order=False)
    _same_tensors(ours.clone().to_dict(), theirs.clone().to_dict(), "clone", key_order=False)
    grown_ours, grown_theirs = ours.clone(), theirs.clone()
    grown_ours.append(ours.clone())
    grown_theirs.append(theirs.clone())
    _same_tensors(grown_ours.to_dict(), grown_theirs.to_dict(), "append", key_order=False)
    assert grown_ours.num_nodes_list == grown_theirs.num_nodes_list
    assert torch.equal(grown_ours.batch_ptr, grown_theirs.batch_ptr)
