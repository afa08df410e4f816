"""What the read tests share: two packed windows compared field by field."""

from __future__ import annotations

import numpy as np


def assert_same_packed(got: object, want: object) -> None:
    """The same fields (names, dtype, shape, values) and per-sample counts."""
    assert got.fields.keys() == want.fields.keys()  # type: ignore[attr-defined]
    for name, expected in want.fields.items():  # type: ignore[attr-defined]
        actual = got.fields[name]  # type: ignore[attr-defined]
        assert actual.dtype == expected.dtype and actual.shape == expected.shape, name
        np.testing.assert_array_equal(actual, expected, err_msg=name)
    np.testing.assert_array_equal(got.n_atoms, want.n_atoms)  # type: ignore[attr-defined]
    np.testing.assert_array_equal(got.n_edges, want.n_edges)  # type: ignore[attr-defined]
