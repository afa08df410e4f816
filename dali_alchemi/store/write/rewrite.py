"""Rewrite: copy a store to a new one in another layout (codecs, chunks, shards), checked before it counts.

Any store this project reads (written here or by nvalchemi, appended and repaired, sharded, remote)
is copied array by array into a hidden staging directory beside the destination, in steps of whole
target shards (or chunks) of at most about :data:`STEP_BYTES`, so memory stays bounded and no shard
is written twice. Every array is copied as stored: the same rows, so soft-deleted samples and the
masks that hide them stay as they were, unless ``compact=True``, which streams only the live samples
(the defragment's copy). The copy is then compared with the source, array by array, and verified
(:func:`~dali_alchemi.store.check.verify.verify_store`: every chunk decoded, checksums, pointers, masks,
neighbor lists); only then is the staging directory renamed to the destination. A rewrite killed at
any moment leaves no destination, and the next one removes what it left.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import zarr

from dali_alchemi.config import WriteConfig, layout_config
from dali_alchemi.errors import ConfigError, RewriteMismatchError, StoreExistsError
from dali_alchemi.store.format import layout
from dali_alchemi.store.format.location import resolve_store
from dali_alchemi.store.read.open_checks import check_meta, open_root
from dali_alchemi.store.read.reader import AtomicDataZarrReader
from dali_alchemi.store.write.arrays import create_array, promise
from dali_alchemi.store.write.refusals import is_refusal, refused

if TYPE_CHECKING:
    from dali_alchemi.store.format.location import StoreLike, StoreLocation
    from dali_alchemi.store.read.open_checks import MetaInfo

__all__ = ["SIZE_SAMPLE", "STAGING_SUFFIX", "STEP_BYTES", "Progress", "RewriteReport", "rewrite_store", "staging_path"]


STEP_BYTES = 64 << 20
"""Bytes of one array copied per step (rounded to whole target shards or chunks)."""

STAGING_SUFFIX = "rewrite-partial"
"""The hidden directory beside the destination that a rewrite builds, renamed into place when checked."""

Progress = Callable[[str, int, int], None]
"""Called with a phase (``"copy"`` or ``"check"``), the bytes done and the bytes in all."""


@dataclass(frozen=True, slots=True)
class RewriteReport:
    """What :func:`rewrite_store` did: samples kept, bytes on disk before and after, seconds taken."""

    source: str
    destination: str
    samples: int
    deleted_kept: int
    bytes_before: int | None
    bytes_after: int
    seconds: float


def staging_path(dst: Path) -> Path:
    """The hidden directory beside ``dst`` in which a rewrite builds it."""
    return dst.with_name(f".{dst.name}.dali-alchemi-{STAGING_SUFFIX}")


def rewrite_store(
    src: StoreLike,
    dst: str | Path,
    config: WriteConfig | str | None = None,
    *,
    compact: bool = False,
    progress: Progress | None = None,
) -> RewriteReport:
    """Copy the store ``src`` to a new local store ``dst`` in the layout of ``config``.

    ``config`` is a :class:`~dali_alchemi.config.WriteConfig`, a layout name (``"default"``,
    ``"compressed"``, ``"uncompressed"``) or ``None`` (the default layout). ``compact=True`` drops
    soft-deleted samples; otherwise they and the masks stay as stored.

    Raises
    ------
    ConfigError
        If ``dst`` is the source, inside it, or holds it (a ``ValueError``); before anything is written.
    StoreExistsError
        If ``dst`` exists (a ``FileExistsError``): a rewrite never replaces a store.
    StoreNotFoundError
        If there is no store at ``src``.
    RewriteMismatchError
        If the copy differs from the source or fails verification (nothing is left at ``dst``).
    StoreWriteError
        If the operating system refuses a write (no space left, read-only, permissions; an ``OSError``
        with its errno); nothing is left at ``dst``.
    """
    write = layout_config(config) if isinstance(config, str) else config or WriteConfig()
    target = Path(dst)
    loc = resolve_store(src, read_only=True, must_exist=True)
    if loc.local_root is not None:
        _check_apart(loc.local_root, target)
    if target.exists():
        raise StoreExistsError(f"Rewrite destination {target} exists: a rewrite writes a new store, choose another path")
    started = time.perf_counter()
    staging = staging_path(target)
    root = open_root(loc)
    meta = check_meta(root, store=loc.display)
    try:
        shutil.rmtree(staging, ignore_errors=True)  # what a killed rewrite left
        target.parent.mkdir(parents=True, exist_ok=True)
        if compact:
            _copy_compacted(loc, root, meta, staging, write)
        else:
            _copy_arrays(root, meta, staging, write, progress)
        _check_copy(loc, staging, compact, progress)
        staging.rename(target)
    except BaseException as err:
        removed = _remove_staging(staging)
        if is_refusal(err):
            assert isinstance(err, OSError)
            state = (
                f"Nothing was left at {target}; the source was only read."
                if removed
                else f"The partial copy {staging} could not be removed (remove it); the source was only read."
            )
            raise refused(loc, f"rewrite to {target}", err, state) from err
        raise
    deleted = 0 if compact else int(meta.samples_mask.size - meta.samples_mask.sum())
    return RewriteReport(
        source=loc.display, destination=str(target), samples=int(meta.samples_mask.sum()), deleted_kept=deleted,
        bytes_before=_disk_bytes(loc.local_root) if loc.local_root is not None else None,
        bytes_after=_disk_bytes(target), seconds=time.perf_counter() - started,
    )  # fmt: skip


def _remove_staging(staging: Path, *, attempts: int = 20, pause_s: float = 0.05) -> bool:
    """Remove a failed rewrite's partial copy; whether it is gone.

    A removal can leave the folder behind (a file that could not be removed, or one written into it
    while it was removed), so it is tried again, up to ``attempts`` times, before the error says
    where the partial copy is.
    """
    for attempt in range(attempts):
        shutil.rmtree(staging, ignore_errors=True)
        if not os.path.lexists(staging):
            return True
        if attempt + 1 < attempts:
            time.sleep(pause_s)
    return False


def _check_apart(source: Path, target: Path) -> None:
    """Refuse a destination (or its staging directory) that is the source, inside it, or around it.

    A destination inside the source would be built and renamed into the source's tree (a foreign group
    in the store being copied); the source inside the destination, or the staging directory being the
    source, would have the rewrite remove or replace the store it copies. Links are resolved first.
    """
    src = source.resolve()
    for path, what in ((target, "destination"), (staging_path(target), "staging directory")):
        dst = path.resolve()
        if dst == src:
            problem = f"the {what} {path} is the source store"
        elif dst.is_relative_to(src):
            problem = f"the {what} {path} is inside the source store"
        elif src.is_relative_to(dst):
            problem = f"the source store is inside the {what} {path}"
        else:
            continue
        raise ConfigError(
            f"Rewrite of {source} to {target}: {problem}, so the rewrite would change the store it copies; "
            f"nothing was written. Choose a destination outside {source}"
        )


def _copy_arrays(root: Any, meta: MetaInfo, staging: Path, config: WriteConfig, progress: Progress | None) -> None:
    """Copy every meta, core and custom array of ``root`` into a new store at ``staging``, rows as stored."""
    new_root = zarr.open_group(str(staging), mode="w")
    sources: list[tuple[str, str, Any]] = [(layout.META_GROUP, name, root[f"{layout.META_GROUP}/{name}"])
                                           for name in layout.META_ARRAYS if name in root[layout.META_GROUP]]  # fmt: skip
    sources += [(meta.schema.group_of(name), name, root[f"{meta.schema.group_of(name)}/{name}"])
                for name in meta.schema.field_levels]  # fmt: skip
    total = sum(int(arr.nbytes) for _, _, arr in sources)
    done = 0
    configs = []
    groups = {g: new_root.require_group(g) for g in (layout.META_GROUP, layout.CORE_GROUP, layout.CUSTOM_GROUP)}
    chosen: dict[tuple[str, str], Any] = {}
    for group in groups:
        arrays = {name: arr for g, name, arr in sources if g == group}
        chosen.update({(group, name): cfg for name, cfg in config.for_arrays(group, arrays).items()})
    for group, name, arr in sources:
        cfg = chosen[(group, name)]
        configs.append(cfg)
        out = create_array(groups[group], name, tuple(arr.shape), np.dtype(arr.dtype), cfg)
        for lo, hi in _steps(out):
            out[lo:hi] = arr[lo:hi]
            done += (hi - lo) * _row_bytes(arr)
            if progress is not None:
                progress("copy", done, total)
    attributes = dict(root.attrs.asdict())
    new_root.attrs.update({**attributes, **promise(configs).to_attributes(attributes)})


def _copy_compacted(loc: StoreLocation, root: Any, meta: MetaInfo, staging: Path, config: WriteConfig) -> None:
    """Stream only the live samples of ``loc`` (open as ``root``, checked as ``meta``) into ``staging``."""
    from dali_alchemi.store.write.defragment import DEFAULT_DEFRAGMENT_WINDOW, DEFRAGMENT_CACHE_BYTES, copy_live

    with AtomicDataZarrReader(loc.store if loc.local_root is None else str(loc.local_root),
                              cache_bytes=DEFRAGMENT_CACHE_BYTES) as reader:  # fmt: skip
        copy_live(reader, root, meta, staging, config, DEFAULT_DEFRAGMENT_WINDOW, lambda _: None)


def _check_copy(loc: StoreLocation, staging: Path, compact: bool, progress: Progress | None) -> None:
    """Compare the copy with its source (every live sample, all fields) and verify it; raise if it differs."""
    from dali_alchemi.store.check.verify import verify_store

    source = loc.store if loc.local_root is None else str(loc.local_root)
    with AtomicDataZarrReader(source, cache_bytes=STEP_BYTES) as old, AtomicDataZarrReader(
        str(staging), cache_bytes=STEP_BYTES
    ) as new:
        if len(old) != len(new) or old.field_levels != new.field_levels:
            raise RewriteMismatchError(
                f"Rewrite of {loc.display}: the copy has {len(new)} samples and fields {new.field_levels}, "
                f"the source {len(old)} and {old.field_levels}"
            )
        step = max(1, STEP_BYTES // max(1, _structure_bytes(old)))
        for start in range(0, len(old), step):
            window = np.arange(start, min(start + step, len(old)))
            a, b = old.read_packed(window), new.read_packed(window)
            for name, values in a.fields.items():
                other = b.fields[name]
                if values.dtype != other.dtype or not np.array_equal(values, other, equal_nan=values.dtype.kind == "f"):
                    raise RewriteMismatchError(
                        f"Rewrite of {loc.display}: field {name!r} of samples {start}..{window[-1]} differs in the copy"
                    )
            if progress is not None:
                progress("check", int(window[-1]) + 1, len(old))
    report = verify_store(str(staging))
    if not report.ok:
        raise RewriteMismatchError(f"Rewrite of {loc.display}: the copy failed verification: {report.problems[0]}")
    if not compact:
        _check_masks(loc, staging)


def _check_masks(loc: StoreLocation, staging: Path) -> None:
    """The copy's pointers and masks are the source's, soft-deleted samples included."""
    old = check_meta(open_root(loc), store=loc.display)
    new = check_meta(zarr.open_group(str(staging), mode="r"), store=str(staging))
    for name in ("atoms_ptr", "edges_ptr", "samples_mask"):
        if not np.array_equal(getattr(old, name), getattr(new, name)):
            raise RewriteMismatchError(f"Rewrite of {loc.display}: meta/{name} differs in the copy")


def _steps(out: Any) -> list[tuple[int, int]]:
    """Row ranges of ``out`` of whole shards (or chunks) covering about :data:`STEP_BYTES` each."""
    rows = int(out.shape[0]) if out.shape else 0
    unit = int((out.shards or out.chunks)[0]) if out.shape else 1
    per_step = unit * max(1, STEP_BYTES // max(1, unit * _row_bytes(out)))
    return [(lo, min(lo + per_step, rows)) for lo in range(0, rows, per_step)]


def _row_bytes(arr: Any) -> int:
    return max(1, int(np.prod(arr.shape[1:], dtype=np.int64))) * np.dtype(arr.dtype).itemsize


SIZE_SAMPLE = 1 << 16
"""Structures, evenly spaced, whose sizes estimate a store's mean structure (not all: that is 40 bytes each)."""


def _structure_bytes(reader: AtomicDataZarrReader) -> int:
    """Mean decoded bytes of one structure over the reader's fields (at least 1), from a bounded sample."""
    picked = np.linspace(0, len(reader) - 1, min(len(reader), SIZE_SAMPLE), dtype=np.int64)
    n_atoms, n_edges = reader.sample_sizes(np.unique(picked))
    per = {"atom": float(n_atoms.mean()) if len(reader) else 0.0, "edge": float(n_edges.mean()) if len(reader) else 0.0,
           "system": 1.0}  # fmt: skip
    return max(1, int(sum(spec.row_nbytes * per[spec.level] for spec in reader.field_specs.values())))


def _disk_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
