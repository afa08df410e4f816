"""Checking sample indices as the caller gave them, before any conversion can wrap them around."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from dali_alchemi.errors import ConfigTypeError, SampleIndexError

if TYPE_CHECKING:
    from dali_alchemi.types import IndexArray

__all__ = ["checked_indices"]


def checked_indices(
    values: Any,
    n: int,
    *,
    what: str = "Index",
    owner: str = "reader",
    negative: bool = True,
    unit: str = "samples",
) -> IndexArray:
    """``values`` as a flat int64 array of indices into ``n`` items; negatives count from the end if allowed.

    The range check runs in the given dtype (a ``uint64`` of ``2**64 - 1`` or a Python integer beyond
    any numpy type is out of range, never wrapped to a small or negative index), and the error names
    the value as given.

    Raises
    ------
    SampleIndexError
        Naming the first out-of-range value and ``n`` (of the ``owner``: a reader, a store), counted
        in ``unit``; or for an array of more than one dimension (never flattened).
    ConfigTypeError
        If the values are not integers (booleans included; a ``TypeError``).
    """
    given = np.asarray(values)
    if given.ndim > 1:  # flattening a (B, k) array would read B * k samples nobody asked for
        raise SampleIndexError(f"{what} values must be one integer or a 1-D sequence, got an array of shape {given.shape}")
    arr = given.reshape(-1)
    if arr.dtype == object and all(isinstance(v, int | np.integer) and not isinstance(v, bool) for v in arr):
        pass  # Python integers too large for any numpy integer type: compared exactly below
    elif arr.dtype == np.bool_ or (arr.size and not np.issubdtype(arr.dtype, np.integer)):
        raise ConfigTypeError(f"{what} values must be integers, got dtype {arr.dtype}")
    if not arr.size:
        return np.zeros(0, np.int64)
    low = -n if negative else 0
    bad = np.asarray((arr >= n) | (arr < low), dtype=np.bool_)
    if bad.any():
        first = arr[np.argmax(bad)]
        raise SampleIndexError(f"{what} {int(first)} out of range for {owner} with {n} {unit}")
    out = arr.astype(np.int64)
    return np.where(out < 0, out + n, out) if negative else out
