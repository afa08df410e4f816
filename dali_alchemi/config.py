"""Write configuration: codecs, chunk and shard sizes per group and per field.

Frozen, keyword-only dataclasses that validate on construction and do no I/O. Chunks and shards are
only ever set along dim 0 (the sample, atom or edge axis); trailing dims are never split, so one row is
always decoded whole. ``None`` for a size means "choose from :data:`DEFAULT_CHUNK_BYTES`", never zarr's
own automatic guess (which splits trailing dims and is frozen at the first write).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
from zarr.abc.codec import BytesBytesCodec
from zarr.codecs import BloscCodec, Crc32cCodec, GzipCodec, ZstdCodec
from zarr.codecs.numcodecs import LZ4, Shuffle

from dali_alchemi.bench.names import STORE_LAYOUTS
from dali_alchemi.errors import ConfigError, ConfigTypeError
from dali_alchemi.keywords import checks_keywords
from dali_alchemi.remote_config import FetchConfig  # re-exported: `from dali_alchemi.config import FetchConfig` works

if TYPE_CHECKING:
    from numpy.typing import NDArray

__all__ = [
    "CHUNKS_PER_SHARD", "COMPRESSED_ARRAYS", "COMPRESSED_CODEC", "DEFAULT_BATCHES_PER_WINDOW", "DEFAULT_CHUNK_BYTES",
    "DEFAULT_COMPRESSORS", "DEFAULT_NUM_WORKERS",
    "DENSE_GAIN", "DENSE_MIN_SAVING", "DENSE_SMALL_CHUNK_CODEC", "DISK_BUDGET", "FAST_SMALL_CHUNK_CODEC",
    "INFLATE_CODECS",
    "LAYOUTS", "RAW_ARRAYS", "SAMPLE_BYTES", "SHARD_BYTES", "SHARD_INDEX_ENTRY_BYTES", "SMALL_CHUNK_BYTES",
    "START_METHODS",
    "ArrayConfig", "FetchConfig", "LoaderConfig", "WriteConfig", "compressed_ratio", "default_array_configs",
    "layout_config", "small_chunk_rows"
]


DEFAULT_CHUNK_BYTES = 4 << 20
"""Target uncompressed bytes per chunk when ``chunk_size`` is not set (4 MiB: fastest shuffled reads
measured: docs/stores.md, "Store layouts and `rewrite`")."""

DEFAULT_COMPRESSORS: tuple[BytesBytesCodec, ...] = (BloscCodec(cname="lz4", clevel=5, shuffle="shuffle"),)
"""Codec chain after the ``bytes`` serializer when none is configured: blosc-lz4 with byte shuffle,
which decoded fastest of the codecs measured (docs/stores.md, "Store layouts and `rewrite`")."""


def _codec_from_json(spec: Mapping[str, Any]) -> BytesBytesCodec:
    """Build a compressor from zarr v3 JSON (``{"name": "zstd", "configuration": {...}}``)."""
    name = spec.get("name")
    conf = dict(spec.get("configuration", {}))
    codecs: dict[str, type[BytesBytesCodec]] = {
        "zstd": ZstdCodec, "blosc": BloscCodec, "gzip": GzipCodec, "crc32c": Crc32cCodec, "numcodecs.lz4": LZ4,
        "numcodecs.shuffle": Shuffle,
    }  # fmt: skip
    if name not in codecs:
        raise ConfigError(f"Unsupported compressor {name!r}: expected one of {sorted(codecs)}")
    with warnings.catch_warnings():  # zarr warns that numcodecs.lz4 is outside the zarr v3 spec
        warnings.simplefilter("ignore")
        return codecs[str(name)](**conf)


@dataclass(frozen=True, slots=True, kw_only=True)
class ArrayConfig:
    """How the arrays of one group (or one overridden field) are stored.

    Parameters
    ----------
    compressors
        Bytes-to-bytes codecs applied after little-endian serialisation. ``()`` stores raw bytes.
    chunk_size
        Rows per chunk along dim 0. ``None`` picks the largest power of two of rows that keeps a chunk
        within :data:`DEFAULT_CHUNK_BYTES` uncompressed.
    shard_size
        Rows per shard along dim 0, a multiple of ``chunk_size``. ``None`` writes no shards.
    checksum
        Append zarr v3's ``crc32c`` codec to every chunk (inside shards too), so that a corrupted
        chunk fails its checksum when read instead of decoding to wrong values. On by default; it
        costs 4 bytes per chunk and one crc32c pass when a chunk is decoded.
    """

    compressors: tuple[BytesBytesCodec, ...] = DEFAULT_COMPRESSORS
    chunk_size: int | None = None
    shard_size: int | None = None
    checksum: bool = True

    def __post_init__(self) -> None:
        comps = tuple(_codec_from_json(c) if isinstance(c, Mapping) else c for c in (self.compressors or ()))
        for c in comps:
            if not isinstance(c, BytesBytesCodec):
                raise ConfigTypeError(f"compressors must be zarr bytes-to-bytes codecs, got {c!r}")
            if isinstance(c, Crc32cCodec):
                raise ConfigError("crc32c is not a compressor: use checksum=True (the default) instead")
        if not isinstance(self.checksum, bool):
            raise ConfigError(f"checksum must be True or False, got {self.checksum!r}")
        object.__setattr__(self, "compressors", comps)
        for name in ("chunk_size", "shard_size"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ConfigError(f"{name} must be a positive integer or None, got {value!r}")
        if self.shard_size is not None and self.chunk_size is None:
            raise ConfigError("shard_size needs an explicit chunk_size (shards are a multiple of chunks)")
        if self.shard_size is not None and self.chunk_size is not None and self.shard_size % self.chunk_size:
            raise ConfigError(f"shard_size ({self.shard_size}) must be a multiple of chunk_size ({self.chunk_size})")

    def rows_per_chunk(self, row_bytes: int) -> int:
        """Rows per chunk for an array whose rows are ``row_bytes`` long."""
        if self.chunk_size is not None:
            return self.chunk_size
        rows = max(1, DEFAULT_CHUNK_BYTES // max(1, row_bytes))
        return 1 << (rows.bit_length() - 1)  # a power of two: chunk boundaries line up across arrays

    @property
    def codecs(self) -> tuple[BytesBytesCodec, ...]:
        """The bytes-to-bytes codecs as written: the compressors, then ``crc32c`` when ``checksum``."""
        return (*self.compressors, Crc32cCodec()) if self.checksum else self.compressors

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form, for benchmark records and ``from_dict``."""
        return {
            "compressors": [c.to_dict() for c in self.compressors],
            "chunk_size": self.chunk_size,
            "shard_size": self.shard_size,
            "checksum": self.checksum,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ArrayConfig:
        """Inverse of :meth:`to_dict`; unknown keys are an error."""
        unknown = set(data) - {"compressors", "chunk_size", "shard_size", "checksum"}
        if unknown:
            raise ConfigError(f"Unknown ArrayConfig keys: {sorted(unknown)}")
        kwargs = dict(data)
        if "compressors" in kwargs:
            kwargs["compressors"] = tuple(_codec_from_json(c) for c in kwargs["compressors"] or ())
        return cls(**kwargs)


COMPRESSED_CODEC = BloscCodec(cname="lz4", clevel=5, shuffle="shuffle")
COMPRESSED_ARRAYS = ArrayConfig(compressors=(COMPRESSED_CODEC,))
"""blosc-lz4 in chunks of about 4 MiB: the former default for every array, and the ``"compressed"`` layout."""

RAW_ARRAYS = ArrayConfig(compressors=())
"""Raw little-endian rows in chunks of about 4 MiB: the ``"uncompressed"`` layout."""

SMALL_CHUNK_BYTES = 128 << 10
"""Target bytes per inner chunk of a core or custom array in the default layout: a random structure
decodes one such chunk per compressed array (16,384 int64 atomic numbers), not a 4 MiB one, and the
last, partly filled chunk of a raw array wastes at most this much disk. Chosen by measurement against
32, 64 and 256 KiB (docs/stores.md, "Choosing the chunk size"): 80x past the cache, 128 KiB reads 1.5x
faster in store and block order than 32 KiB (2.7-2.9x on a realistic MD store), at a block-order shuffle
quality of 0.73-0.80 instead of 0.90-0.93, since block-order spans follow the chunks."""

SHARD_BYTES = 32 << 20
"""Target bytes of rows per shard file in the default layout: small chunks in few files, so a shuffled
window opens a few dozen files, not hundreds."""

CHUNKS_PER_SHARD = SHARD_BYTES // SMALL_CHUNK_BYTES
"""Inner chunks per shard in the default layout (256: :data:`SHARD_BYTES` of rows per file)."""


FAST_SMALL_CHUNK_CODEC = BloscCodec(cname="blosclz", clevel=5, shuffle="shuffle")
"""blosc's own blosclz with byte shuffle: the fastest to decode of blosc's codecs on small chunks (a
128 KiB chunk of atomic numbers in 11 µs and of neighbor lists in 20 µs, against 14 and 30 µs for lz4 with
byte shuffle and 50 and 73 µs for lz4 with bit shuffle, measured side by side on one thread), keeping
0.13-0.15 of them (lz4 with bit shuffle: 0.08-0.13). A random structure decodes one chunk per compressed
array, so decode speed sets the speed of shuffled reads."""

DENSE_SMALL_CHUNK_CODEC = BloscCodec(cname="zstd", clevel=1, shuffle="bitshuffle")
"""blosc-zstd level 1 with bit shuffle: 77-91 µs per 128 KiB chunk, but keeps 2-3x fewer bytes of
repetitive arrays (periodic shifts of a crystal: 0.02-0.04 against 0.05-0.09 with lz4)."""

DENSE_GAIN = 2.0
"""The denser codec is chosen for an array only when it keeps this many times fewer bytes of its sample..."""

DENSE_MIN_SAVING = 0.02
"""... and saves at least this share of the raw bytes (not so for arrays both codecs shrink to nothing)."""

DISK_BUDGET = 1.2
"""The default layout stores a group's arrays in at most this many times the bytes the ``"compressed"``
layout would (blosc-lz4 in 4 MiB chunks), as estimated from each array's first rows."""

with warnings.catch_warnings():  # zarr warns that numcodecs' codecs are outside the zarr v3 spec
    warnings.simplefilter("ignore")
    INFLATE_CODECS: tuple[BytesBytesCodec, ...] = (Shuffle(), LZ4(acceleration=1))
"""numcodecs' byte shuffle (by element: the dtype's size), then numcodecs' LZ4 (zarr's ``numcodecs.shuffle``
and ``numcodecs.lz4``): each chunk is its decoded size in 4 bytes, then one raw LZ4 block, which DALI's
nvCOMP inflate (``fn.decoders.inflate``, ``algorithm="LZ4"``) decodes on the GPU as stored, and the GPU
undoes the shuffle with one transpose. The shuffle makes LZ4 keep what blosc does with its own shuffle
(0.13-0.14 of atomic numbers and neighbor lists, against 0.36-0.40 without it). The ``"inflate"`` layout
compresses with these the arrays the default layout compresses."""

SHARD_INDEX_ENTRY_BYTES = 16
"""Bytes of one inner chunk's entry (offset and length) in a shard's index."""

SAMPLE_BYTES = 1 << 20
"""Bytes of an array's first rows compressed, chunk by chunk, to choose its codec."""


def compressed_ratio(sample: NDArray[Any], codec: BloscCodec, chunk_rows: int) -> float:
    """Compressed over raw size of ``sample``'s first :data:`SAMPLE_BYTES`, compressed ``chunk_rows`` rows at a time."""
    from numcodecs import Blosc

    data = np.ascontiguousarray(sample)
    rows = max(1, min(data.shape[0], SAMPLE_BYTES // max(1, data[:1].nbytes)))
    data = data[:rows]
    if data.nbytes == 0:
        return 1.0
    shuffle = {"noshuffle": Blosc.NOSHUFFLE, "shuffle": Blosc.SHUFFLE, "bitshuffle": Blosc.BITSHUFFLE}[codec.shuffle.value]
    compressor = Blosc(cname=codec.cname.value, clevel=codec.clevel, shuffle=shuffle)
    packed = sum(len(compressor.encode(data[i : i + chunk_rows])) for i in range(0, rows, chunk_rows))
    return packed / data.nbytes


def small_chunk_rows(row_bytes: int) -> int:
    """Rows per inner chunk in the default layout: a power of two of about :data:`SMALL_CHUNK_BYTES`."""
    rows = max(1, SMALL_CHUNK_BYTES // max(1, row_bytes))
    return 1 << (rows.bit_length() - 1)  # a power of two: chunk boundaries line up across arrays


def _sample(data: Any) -> tuple[NDArray[Any] | None, int, int]:
    """``(first rows, bytes per row, bytes in all)`` of an array or array-like (``None``: no rows)."""
    if data is None:
        return None, 1, 0
    row = max(1, math.prod(int(d) for d in data.shape[1:])) * np.dtype(data.dtype).itemsize
    rows = int(data.shape[0]) if data.shape else 0
    sample = np.asarray(data[: max(1, SAMPLE_BYTES // row)]) if rows else None
    return sample, row, row * rows


def _best_codec(sample: NDArray[Any], rows: int) -> tuple[BloscCodec, float]:
    """The small-chunk codec for ``sample`` and the share of its bytes it keeps."""
    fast = compressed_ratio(sample, FAST_SMALL_CHUNK_CODEC, rows)
    dense = compressed_ratio(sample, DENSE_SMALL_CHUNK_CODEC, rows)
    if dense * DENSE_GAIN < fast and fast - dense >= DENSE_MIN_SAVING:
        return DENSE_SMALL_CHUNK_CODEC, dense
    return FAST_SMALL_CHUNK_CODEC, fast


def default_array_configs(
    group: str, arrays: Mapping[str, Any], *, codecs: tuple[BytesBytesCodec, ...] | None = None
) -> dict[str, ArrayConfig]:
    """The default layout's configs for the arrays of one group, written together (values or arrays).

    Arrays stored raw are read in place by a local reader, a structure's rows at a time, at any cache
    size; compressed ones cost the decode of a whole chunk per random structure. So the default
    layout stores raw all it can within a disk budget: starting from every array raw, it compresses
    the arrays that save the most bytes (estimated from their first rows, chunk by chunk) until the
    group takes at most :data:`DISK_BUDGET` times the bytes of the ``"compressed"`` layout. Measured
    (docs/stores.md, "Store layouts and `rewrite`"): real positions, forces and velocities keep 0.83-0.94 of
    their bytes, so they stay raw, while atomic numbers, neighbor lists and periodic shifts shrink 8x
    to 50x and are compressed. Every array is stored in inner chunks of about
    :data:`SMALL_CHUNK_BYTES` (cheap to decode one structure at a time) inside shards of
    :data:`CHUNKS_PER_SHARD` chunks; compressed ones with :data:`FAST_SMALL_CHUNK_CODEC`, or
    :data:`DENSE_SMALL_CHUNK_CODEC` where it keeps :data:`DENSE_GAIN` times fewer bytes. The metadata
    group (pointers, masks) keeps 4 MiB compressed chunks: it is read whole when a store is opened.
    ``codecs``, when given, replace the chosen blosc codec of every compressed array (the ``"inflate"``
    layout's :data:`INFLATE_CODECS`); which arrays are compressed is decided as without them.
    """
    if group == "meta":
        return {name: COMPRESSED_ARRAYS for name in arrays}
    replacement = codecs
    plans: dict[str, tuple[int, BloscCodec | None, int, int]] = {}  # rows per chunk, codec, raw and packed bytes
    reference: dict[str, int] = {}  # bytes in the "compressed" layout: the budget's measure
    for name, data in arrays.items():
        sample, row, total = _sample(data)
        rows = small_chunk_rows(row)
        # a raw array stores its last inner chunk whole; every shard adds its index
        chunks = -(-total // (rows * row))
        index = -(-chunks // CHUNKS_PER_SHARD) * (CHUNKS_PER_SHARD * SHARD_INDEX_ENTRY_BYTES + 4)
        if sample is None or sample.size == 0:
            codec, packed, reference[name] = None, total, total
        else:
            codec, ratio = _best_codec(sample, rows)
            packed = int(total * ratio) + index
            compressed_rows = COMPRESSED_ARRAYS.rows_per_chunk(row)
            reference[name] = int(total * compressed_ratio(sample, COMPRESSED_CODEC, compressed_rows))
        total = chunks * rows * row + index
        plans[name] = (rows, codec, total, packed)
    size = sum(total for _, _, total, _ in plans.values())
    budget = DISK_BUDGET * sum(min(total, reference[name]) for name, (_, _, total, _) in plans.items())
    compressed: set[str] = set()
    for name in sorted(plans, key=lambda n: plans[n][3] - plans[n][2]):  # the largest saving first
        rows, codec, total, packed = plans[name]
        if size <= budget or codec is None or packed >= total:
            break
        compressed.add(name)
        size -= total - packed
    return {
        name: ArrayConfig(
            compressors=(replacement or (chosen,)) if name in compressed and chosen is not None else (),
            chunk_size=rows,
            shard_size=rows * CHUNKS_PER_SHARD,
        )
        for name, (rows, chosen, _, _) in plans.items()
    }


@dataclass(frozen=True, slots=True, kw_only=True)
class WriteConfig:
    """Per-group array configs plus whole-config overrides per array name.

    A group left at ``None`` follows the default layout (:func:`default_array_configs`: arrays raw
    where a disk budget allows, the others compressed, in small inner chunks inside shards; metadata
    in 4 MiB compressed chunks); a group given an :class:`ArrayConfig` uses it for every array of the group. As in nvalchemi, an override
    *replaces* its group's config for that array (nothing is merged), and overrides are looked up by
    array name, so they apply to meta arrays (``atoms_ptr``) too.
    """

    meta: ArrayConfig | None = None
    core: ArrayConfig | None = None
    custom: ArrayConfig | None = None
    field_overrides: Mapping[str, ArrayConfig] = field(default_factory=dict)
    compressed_codecs: tuple[BytesBytesCodec, ...] | None = None
    """The codecs of the arrays the default layout compresses, instead of its blosc choice (``None``: blosc)."""

    def __post_init__(self) -> None:
        if self.compressed_codecs is not None:
            codecs = tuple(_codec_from_json(c) if isinstance(c, Mapping) else c for c in self.compressed_codecs)
            if not codecs or any(not isinstance(c, BytesBytesCodec) or isinstance(c, Crc32cCodec) for c in codecs):
                raise ConfigTypeError(
                    f"WriteConfig.compressed_codecs must be zarr bytes-to-bytes compressors, got {self.compressed_codecs!r}"
                )
            object.__setattr__(self, "compressed_codecs", codecs)
        for group in ("meta", "core", "custom"):
            value = getattr(self, group)
            if isinstance(value, Mapping):
                object.__setattr__(self, group, ArrayConfig.from_dict(value))
            elif value is not None and not isinstance(value, ArrayConfig):
                raise ConfigTypeError(f"WriteConfig.{group} must be an ArrayConfig, a mapping or None, got {value!r}")
        overrides = {
            str(k): ArrayConfig.from_dict(v) if isinstance(v, Mapping) else v for k, v in self.field_overrides.items()
        }
        for k, v in overrides.items():
            if not isinstance(v, ArrayConfig):
                raise ConfigTypeError(f"field_overrides[{k!r}] must be an ArrayConfig or a mapping, got {v!r}")
        object.__setattr__(self, "field_overrides", overrides)

    def for_arrays(self, group: str, arrays: Mapping[str, Any]) -> dict[str, ArrayConfig]:
        """The configs of the arrays ``arrays`` (name to values, or to an array to sample) of ``group``.

        Overrides and a group config apply as given; the arrays left to the default layout are laid
        out together (:func:`default_array_configs`: raw where the disk budget allows).
        """
        chosen: ArrayConfig | None = getattr(self, group)
        configs = {name: self.field_overrides[name] for name in arrays if name in self.field_overrides}
        rest = {name: data for name, data in arrays.items() if name not in configs}
        if chosen is not None:
            configs.update({name: chosen for name in rest})
        elif rest:
            configs.update(default_array_configs(group, rest, codecs=self.compressed_codecs))
        return {name: configs[name] for name in arrays}

    def for_array(self, group: str, name: str, data: Any = None) -> ArrayConfig:
        """The config of one array ``name`` of ``group`` (``meta``, ``core`` or ``custom``), written alone."""
        return self.for_arrays(group, {name: data})[name]

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (``None`` for a group that follows the default layout)."""
        groups = {g: None if getattr(self, g) is None else getattr(self, g).to_dict() for g in ("meta", "core", "custom")}
        codecs = None if self.compressed_codecs is None else [c.to_dict() for c in self.compressed_codecs]
        overrides = {k: v.to_dict() for k, v in sorted(self.field_overrides.items())}
        return {**groups, "field_overrides": overrides, "compressed_codecs": codecs}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> WriteConfig:
        """Inverse of :meth:`to_dict`; also accepts nvalchemi-style plain mappings."""
        unknown = set(data) - {"meta", "core", "custom", "field_overrides", "compressed_codecs"}
        if unknown:
            raise ConfigError(f"Unknown WriteConfig keys: {sorted(unknown)}")
        return cls(**dict(data))


def layout_config(name: str) -> WriteConfig:
    """The :class:`WriteConfig` of a named layout (one of :data:`STORE_LAYOUTS`).

    ``"default"`` is ``WriteConfig()``; ``"compressed"`` stores every array blosc-lz4 in 4 MiB chunks
    (this project's default before, and close to what nvalchemi writes); ``"uncompressed"`` stores
    every core and custom array raw (metadata stays compressed); ``"inflate"`` is the default layout with
    :data:`INFLATE_CODECS` for its compressed arrays, whose chunks DALI can inflate on the GPU as stored
    (``DALIDataLoader(layout="inflate")``).
    """
    if name == "default":
        return WriteConfig()
    if name == "inflate":
        return WriteConfig(compressed_codecs=INFLATE_CODECS)
    if name == "compressed":
        return WriteConfig(meta=COMPRESSED_ARRAYS, core=COMPRESSED_ARRAYS, custom=COMPRESSED_ARRAYS)
    if name == "uncompressed":
        return WriteConfig(meta=COMPRESSED_ARRAYS, core=RAW_ARRAYS, custom=RAW_ARRAYS)
    raise ConfigError(f"Unknown store layout {name!r}: expected one of {', '.join(STORE_LAYOUTS)}")


DEFAULT_NUM_WORKERS = 2
"""DALI worker processes by default (nvalchemi's default too): on the 2-core reference machine two workers
delivered the reader's full packed-read rate, while reading on a background thread of the training
process reached about 60% of it (GIL contention); see docs/benchmarks.md."""

DEFAULT_BATCHES_PER_WINDOW = 16
"""Batches read with one call to the reader by default (nvalchemi's ``prefetch_factor``)."""

START_METHODS = ("auto", "fork", "spawn")
LAYOUTS = ("window", "blob", "inflate")
"""How a window goes through DALI: one sample per output (``"window"``), every output in one byte
buffer (``"blob"``: one host-to-device copy per window), or the fields stored as LZ4 blocks as their
compressed chunks, inflated on the GPU by nvCOMP (``"inflate"``: :mod:`dali_alchemi.pipeline.inflate`)."""


@checks_keywords()
@dataclass(frozen=True, slots=True, kw_only=True)
class LoaderConfig:
    """How :class:`~dali_alchemi.pipeline.loader.DALIDataLoader` reads and moves data (see its docstring).

    Which structures form a batch is the plan's business, not this config's. ``batches_per_window`` is
    how many of the plan's batches are read together with one call to the reader (nvalchemi calls this
    ``prefetch_factor``; the name is not reused because torch's ``prefetch_factor`` means something else).
    """

    batches_per_window: int = DEFAULT_BATCHES_PER_WINDOW
    num_workers: int = DEFAULT_NUM_WORKERS
    device: str = "auto"
    fields: tuple[str, ...] | None = None
    read_ahead: int = 2
    start_method: str = "auto"
    queue_depth: int = 2
    cache_bytes: int | None = None
    layout: str = "window"

    def __post_init__(self) -> None:
        for name in ("batches_per_window", "read_ahead", "queue_depth"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"{name} must be a positive integer, got {value!r}")
        if isinstance(self.num_workers, bool) or not isinstance(self.num_workers, int) or self.num_workers < 0:
            raise ConfigError(f"num_workers must be a non-negative integer, got {self.num_workers!r}")
        if self.layout not in LAYOUTS:
            raise ConfigError(f"layout must be one of {LAYOUTS}, got {self.layout!r}")
        if self.start_method not in START_METHODS:
            raise ConfigError(f"start_method must be one of {START_METHODS}, got {self.start_method!r}")
        if self.cache_bytes is not None and (not isinstance(self.cache_bytes, int) or self.cache_bytes < 0):
            raise ConfigError(f"cache_bytes must be a non-negative integer or None, got {self.cache_bytes!r}")
        if self.fields is not None:
            object.__setattr__(self, "fields", tuple(self.fields))

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form, for benchmark records."""
        return {name: getattr(self, name) for name in self.__dataclass_fields__}
