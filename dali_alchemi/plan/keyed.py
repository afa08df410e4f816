"""A keyed permutation evaluated one position at a time: an epoch's order without materialising it.

``rng.permutation(n)`` draws the whole order at once: at 110 M structures that is 880 MB in every
rank, though a rank visits only one ``num_shards``-th of it. :func:`keyed_order` instead computes
the order at any given positions, so a rank evaluates only its own (``r, r + W, r + 2W, ...``), in
blocks, with memory proportional to what it keeps.

The permutation is a Feistel network over ``[0, a * b)`` with ``a = ceil(sqrt(n))`` and
``b = ceil(n / a)`` (two digits of mixed radix, as in Black and Rogaway's ciphers with arbitrary
finite domains), keyed by ``(seed, epoch)`` through numpy's ``SeedSequence``; each round is a
bijection, so the network is one. Values that land in ``[n, a * b)`` (fewer than ``a`` of them) are
walked through the network again until they fall inside ``[0, n)`` (cycle walking), which keeps it
a bijection on ``[0, n)``. Pure numpy, vectorised: a few integer operations per round and position.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from dali_alchemi.errors import PlanIndexError

if TYPE_CHECKING:
    from numpy.typing import NDArray

    from dali_alchemi.types import IndexArray

__all__ = ["KEYED_BLOCK", "KEYED_ROUNDS", "KEYED_STREAM", "ShardOrder", "keyed_order", "keyed_shard"]


KEYED_ROUNDS = 4
"""Feistel rounds: four make a pseudorandom permutation of a good round function (Luby and Rackoff);
positions and values come out uncorrelated (see the plan tests)."""

KEYED_STREAM = 0xFE15
"""Mixed into the seed so the keyed permutation's keys are not the drawn permutation's stream."""

KEYED_BLOCK = 1 << 15
"""Positions evaluated at once: bounds the temporaries (a few arrays of this many, cache-sized)."""

_FINALISERS = {  # (shift, multiplier) steps: a shortened murmur3 fmix32, and splitmix64's finaliser
    np.dtype(np.uint32): ((0, 0x85EBCA6B), (13, 0xC2B2AE35), (16, None)),
    np.dtype(np.uint64): ((30, 0xBF58476D1CE4E5B9), (27, 0x94D049BB133111EB), (31, None)),
}


def _keys(seed: int, epoch: int, stream: int, dtype: np.dtype) -> list[np.unsignedinteger]:
    sequence = np.random.SeedSequence([seed & 0xFFFFFFFF, seed >> 32, epoch, KEYED_STREAM, stream])
    return list(sequence.generate_state(KEYED_ROUNDS, dtype=dtype))


def _round_value(z: NDArray[np.unsignedinteger], key: np.unsignedinteger, modulus: np.unsignedinteger) -> None:
    """The round function, in place: ``z`` hashed with ``key`` (a 32- or 64-bit finaliser), brought into ``[0, modulus)``.

    32-bit hashes are scaled (their top 16 bits times ``modulus``, shifted down: ``modulus <= 2**16``
    there), 64-bit ones reduced modulo ``modulus``; either way a function of the digit alone, which is
    all a Feistel round needs to be a bijection.
    """
    kind = z.dtype.type
    z ^= key
    for shift, multiplier in _FINALISERS[z.dtype]:
        if shift:
            z ^= z >> kind(shift)
        if multiplier is not None:
            z *= kind(multiplier)
    if z.dtype == np.uint32:
        z >>= kind(16)
        z *= modulus
        z >>= kind(16)
    else:
        z %= modulus


def _encrypt(
    x: NDArray[np.unsignedinteger], keys: list[np.unsignedinteger], a: np.unsignedinteger, b: np.unsignedinteger
) -> NDArray[np.unsignedinteger]:
    """One pass of the network over ``[0, a * b)``, in place: rounds alternate the radix ``a`` and ``b``."""
    high, scratch = np.empty_like(x), np.empty_like(x)
    for j, key in enumerate(keys):
        small, big = (a, b) if j % 2 == 0 else (b, a)
        np.floor_divide(x, small, out=high)  # x = high * small + low, low in [0, small), high in [0, big)
        np.multiply(high, small, out=scratch)
        x -= scratch  # x is now the low digit
        np.copyto(scratch, high)
        _round_value(scratch, key, small)
        x += scratch
        np.floor_divide(x, small, out=scratch)  # modulo small (floor division by a scalar is the fast one)
        scratch *= small
        x -= scratch
        x *= big
        x += high  # the digits swap places: the next round splits by the other radix
    return x


def keyed_order(
    positions: NDArray[np.integer] | range, n: int, *, seed: int, epoch: int, stream: int = 0
) -> IndexArray:
    """``order[positions]`` of the keyed permutation of ``range(n)`` for ``(seed, epoch, stream)``, as int64.

    ``positions`` must lie in ``[0, n)``; a ``range`` (of step 1) is never made into an int64 array.
    The same ``(n, seed, epoch, stream)`` always gives the same permutation; evaluating it at every
    position of ``range(n)`` gives every value exactly once.
    """
    out = np.empty(len(positions), dtype=np.int64)
    if n == 0 or out.size == 0:
        return out
    a = math.isqrt(n - 1) + 1  # ceil(sqrt(n))
    b = -(-n // a)
    dtype = np.dtype(np.uint32 if a * b <= 0xFFFFFFFF else np.uint64)  # 32-bit digits run twice as fast
    digit = cast("type[np.unsignedinteger]", dtype.type)
    ua, ub, limit = digit(a), digit(b), digit(n)
    keys = _keys(seed, epoch, stream, dtype)
    for lo in range(0, out.size, KEYED_BLOCK):
        if isinstance(positions, range):
            chunk = np.arange(positions.start + lo, positions.start + min(lo + KEYED_BLOCK, out.size), dtype=dtype)
        else:
            chunk = np.asarray(positions[lo : lo + KEYED_BLOCK]).astype(dtype)
        x = _encrypt(chunk, keys, ua, ub)
        outside = np.flatnonzero(x >= limit)
        while outside.size:  # cycle walking: fewer than a of the a * b values lie outside [0, n)
            walked = _encrypt(x[outside], keys, ua, ub)
            x[outside] = walked
            outside = outside[walked >= limit]
        out[lo : lo + x.size] = x
    return out


def _shard_positions(n: int, shard_id: int, num_shards: int, lo: int, hi: int) -> IndexArray:
    """Positions ``lo:hi`` of a shard in the padded order: ``shard_id + k * num_shards`` for ``k`` in ``[lo, hi)``, modulo ``n``."""
    positions = np.arange(shard_id + lo * num_shards, shard_id + hi * num_shards, num_shards, dtype=np.int64)
    positions %= n
    return positions


def keyed_shard(n: int, *, seed: int, epoch: int, shuffle: bool, shard_id: int, num_shards: int) -> IndexArray:
    """Shard ``shard_id`` of the keyed epoch order, padded by wrapping like ``DistributedSampler``.

    The shard's positions of the padded order are ``shard_id, shard_id + num_shards, ...`` below
    ``ceil(n / num_shards) * num_shards``, each taken modulo ``n``: exactly what
    :func:`~dali_alchemi.plan.order.shard` takes of the whole order, computed for this shard alone.
    """
    per_shard = math.ceil(n / num_shards) if n else 0
    out = np.empty(per_shard, dtype=np.int64)
    for lo in range(0, per_shard, KEYED_BLOCK):  # positions made a block at a time: only the shard's order is held
        hi = min(lo + KEYED_BLOCK, per_shard)
        positions = _shard_positions(n, shard_id, num_shards, lo, hi)
        out[lo:hi] = keyed_order(positions, n, seed=seed, epoch=epoch) if shuffle else positions
    return out


@dataclass(frozen=True, slots=True, kw_only=True)
class ShardOrder:
    """:func:`keyed_shard`'s order, computed only where it is read: an epoch's order in a few bytes.

    At 110 M structures a rank's eighth of the order is 110 MB of int64 in every process that plans
    the epoch (the loader and each of its DALI workers). This holds the recipe instead; slicing it, as
    an :class:`~dali_alchemi.plan.base.EpochPlan` does for each batch and window, evaluates just those
    positions (a window's worth of integer operations). ``np.asarray(order)`` gives the whole array.
    It reads like the 1-D int64 array it stands for: ``size``, ``shape``, ``len``, ``dtype``,
    integer, slice and index-array subscripts, ``tolist``.
    """

    n: int
    seed: int
    epoch: int
    shuffle: bool
    shard_id: int
    num_shards: int

    @property
    def size(self) -> int:
        """Entries in the shard's order, padding included."""
        return math.ceil(self.n / self.num_shards) if self.n else 0

    @property
    def shape(self) -> tuple[int]:
        return (self.size,)

    @property
    def ndim(self) -> int:
        return 1

    @property
    def dtype(self) -> np.dtype[Any]:
        return np.dtype(np.int64)

    def __len__(self) -> int:
        return self.size

    def _values(self, positions: IndexArray) -> IndexArray:
        return keyed_order(positions, self.n, seed=self.seed, epoch=self.epoch) if self.shuffle else positions

    def __getitem__(self, key: int | slice | NDArray[np.integer]) -> Any:
        if isinstance(key, slice):
            lo, hi, step = key.indices(self.size)
            if step == 1:
                return self._values(_shard_positions(self.n, self.shard_id, self.num_shards, lo, max(lo, hi)))
            return self[np.arange(lo, hi, step, dtype=np.int64)]
        if isinstance(key, (int, np.integer)):
            k = int(key) + self.size if key < 0 else int(key)
            if not 0 <= k < self.size:
                raise PlanIndexError(f"index {int(key)} is out of bounds for a shard order of {self.size} structures")
            return int(self._values(_shard_positions(self.n, self.shard_id, self.num_shards, k, k + 1))[0])
        where = np.asarray(key, dtype=np.int64)
        if where.size and (int(where.min()) < -self.size or int(where.max()) >= self.size):
            raise PlanIndexError(f"an index is out of bounds for a shard order of {self.size} structures")
        where = np.where(where < 0, where + self.size, where)
        positions = (self.shard_id + where * self.num_shards) % self.n if self.n else where
        return self._values(positions)

    def __array__(self, dtype: Any = None, copy: bool | None = None) -> IndexArray:
        whole = keyed_shard(
            self.n, seed=self.seed, epoch=self.epoch, shuffle=self.shuffle, shard_id=self.shard_id,
            num_shards=self.num_shards,
        )  # fmt: skip
        return whole if dtype is None else whole.astype(dtype, copy=False)

    def tolist(self) -> list[int]:
        return np.asarray(self).tolist()
