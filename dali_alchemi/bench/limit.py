"""The layout's physical limit: what the store's codecs do on one core, with the bytes already in memory.

A loader reading a store can be no faster than decoding the chunks it reads. This module measures that
floor of the work for a local store, chunk by chunk, as the reader would meet them: every inner chunk of
every field the reader returns is read once (a shard file at a time, so memory stays at one shard), then
only its decoding is timed on this thread (the fastest of :data:`LIMIT_PASSES` passes over each object): the stored codec (blosc, zstd, gzip) into a reused buffer of
the chunk's size, or a copy of the bytes for raw arrays. Checking crc32c and reading the same bytes again
from the page cache are timed apart, so each can be set beside the decode.

The bench reports ``structures / (crc32c + decode seconds)``, the codec chain as stored, as the ``limit``
row and each loader's share of it; ``page-cache`` is ``structures / read seconds``. Shard indexes are parsed outside the timing: a reader
parses each once and keeps it.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import google_crc32c
import numpy as np
from zarr.storage import LocalStore

from dali_alchemi.errors import ConfigError
from dali_alchemi.store.format.location import resolve_store
from dali_alchemi.store.read.selection import fields_to_read
from dali_alchemi.store.read.snapshot import open_snapshot

if TYPE_CHECKING:
    from numpy.typing import NDArray

    from dali_alchemi.store.read.codecs import ArrayCodec

__all__ = ["ArrayLimit", "LayoutLimit", "measure_layout_limit"]


@dataclass(frozen=True, slots=True)
class ArrayLimit:
    """One field's share of the work: its chunks, their bytes, and the seconds each step took on one core."""

    name: str
    codec: str
    chunks: int
    stored_bytes: int
    decoded_bytes: int
    decode_s: float
    crc32c_s: float
    read_s: float


@dataclass(frozen=True, slots=True)
class LayoutLimit:
    """The limit of a store's layout: the fields' figures, and their sums in structures per second.

    ``skipped`` names the fields whose codec chain the reader's own decoder does not take (zarr decodes
    them, so they have no codec figure here).
    """

    structures: int
    atoms: int
    arrays: tuple[ArrayLimit, ...]
    skipped: tuple[str, ...] = ()

    @property
    def decode_s(self) -> float:
        """Seconds to decode (or copy) every chunk once on one core."""
        return sum(a.decode_s for a in self.arrays)

    @property
    def crc32c_s(self) -> float:
        """Seconds to check the crc32c of every chunk that has one."""
        return sum(a.crc32c_s for a in self.arrays)

    @property
    def read_s(self) -> float:
        """Seconds to read every chunk's file from the page cache."""
        return sum(a.read_s for a in self.arrays)

    @property
    def structures_per_s(self) -> float:
        """The limit: structures over the seconds of the codec chain as stored (crc32c check and decode)."""
        seconds = self.decode_s + self.crc32c_s
        return self.structures / seconds if seconds > 0 else math.inf

    @property
    def decode_structures_per_s(self) -> float:
        """Structures over the decode seconds alone, without the crc32c checks."""
        return self.structures / self.decode_s if self.decode_s > 0 else math.inf

    @property
    def read_structures_per_s(self) -> float:
        """Structures over the page-cache read seconds."""
        return self.structures / self.read_s if self.read_s > 0 else math.inf

    def to_dict(self) -> dict[str, Any]:
        return {
            "structures": self.structures, "atoms": self.atoms, "decode_s": self.decode_s, "crc32c_s": self.crc32c_s, "read_s": self.read_s,
            "structures_per_s": self.structures_per_s,
            "decode_structures_per_s": self.decode_structures_per_s, "read_structures_per_s": self.read_structures_per_s,
            "stored_bytes": sum(a.stored_bytes for a in self.arrays),
            "decoded_bytes": sum(a.decoded_bytes for a in self.arrays),
            "arrays": [asdict(a) for a in self.arrays], "skipped": list(self.skipped),
        }  # fmt: skip


def measure_layout_limit(store: str | Path) -> LayoutLimit:
    """Measure the limit of the local store at ``store`` (see the module docstring).

    Raises
    ------
    ConfigError
        If ``store`` is not a local directory store: the limit times codecs on bytes read from local
        files, which a remote store has none of.
    """
    loc = resolve_store(store, read_only=True, must_exist=True)
    if not isinstance(loc.store, LocalStore):
        raise ConfigError(f"The layout limit is measured on a local directory store; {loc.display!r} is not one")
    root = Path(loc.store.root)
    snapshot = open_snapshot(loc)
    arrays, skipped = [], []
    for name in fields_to_read(snapshot, None):
        codec = snapshot.handles[name].codec
        if codec is None:
            skipped.append(name)
            continue
        arrays.append(_measure_array(codec, root))
    sizes = np.diff(snapshot.atoms_ptr)
    atoms = int(sizes.sum() if snapshot.live is None else sizes[snapshot.live].sum())
    return LayoutLimit(structures=snapshot.n_live, atoms=atoms, arrays=tuple(arrays), skipped=tuple(skipped))


def _shard_keys(codec: ArrayCodec) -> list[str]:
    """The object keys holding ``codec``'s chunks, each once, in store order."""
    keys = {loc.key: None for block in range(codec.n_blocks) for _, loc in codec.chunks_of_block(block)}
    return list(keys)


LIMIT_PASSES = 3
"""Timed passes over each object's chunks; the limit keeps the fastest of each (a shared machine's noise
only ever slows a pass down)."""


def _measure_array(codec: ArrayCodec, root: Path, passes: int = LIMIT_PASSES) -> ArrayLimit:
    """Read each of the array's objects once, then time decoding its chunks, their crc32c, and a page-cache
    read, ``passes`` times per object: the sums of each object's fastest pass."""
    item = codec.stored_dtype.itemsize
    out = np.empty(math.prod(codec.chunk_shape) * item, dtype=np.uint8)
    compressor = codec.compressor
    checksum = codec.chunk_checksum
    chunks = stored = decoded = 0
    decode_s = crc_s = read_s = 0.0
    buffer = bytearray()  # the page-cache read's destination, reused as in a reader's I/O buffer
    for key in _shard_keys(codec):
        path = root / key
        if not path.exists():
            continue  # a chunk never written: nothing to decode (the reader fills it, or reports it missing)
        data = path.read_bytes()  # the first read: brings the file into the page cache
        if len(buffer) < len(data):
            buffer = bytearray(len(data))
        payloads = _payloads(codec, key, np.frombuffer(data, dtype=np.uint8))
        best = [math.inf, math.inf, math.inf]  # this object's decode, crc32c and read seconds
        for _ in range(passes):
            timed = [0.0, 0.0, 0.0]
            started = time.perf_counter()
            with path.open("rb", buffering=0) as fh:
                fh.readinto(memoryview(buffer)[: len(data)])
            timed[2] = time.perf_counter() - started
            for payload in payloads:
                if checksum:
                    started = time.perf_counter()
                    google_crc32c.value(payload[:-4])
                    timed[1] += time.perf_counter() - started
                body = payload[:-4] if checksum else payload
                started = time.perf_counter()
                if compressor is None:
                    np.copyto(out[: body.size], body)
                else:
                    compressor.decode(body, out)
                timed[0] += time.perf_counter() - started
            best = [min(b, t) for b, t in zip(best, timed, strict=True)]
        decode_s, crc_s, read_s = decode_s + best[0], crc_s + best[1], read_s + best[2]
        chunks += len(payloads)
        stored += sum(p.size for p in payloads)
        decoded += out.nbytes * len(payloads)
    return ArrayLimit(
        name=codec.name, codec=codec.codec_name, chunks=chunks, stored_bytes=stored, decoded_bytes=decoded,
        decode_s=decode_s, crc32c_s=crc_s, read_s=read_s,
    )  # fmt: skip


def _payloads(codec: ArrayCodec, key: str, data: NDArray[np.uint8]) -> list[NDArray[np.uint8]]:
    """The written inner chunks of one object (a shard, or a chunk), as views of its bytes."""
    if not codec.sharded:
        return [data]
    tail = data[-codec.index_nbytes :] if codec.index_at_end else data[: codec.index_nbytes]
    index = codec.parse_shard_index(key, tail)
    ranges = (codec.shard_payload_range(index, inner) for inner in range(index.shape[0]))
    return [data[start:stop] for start, stop in (r for r in ranges if r is not None)]
