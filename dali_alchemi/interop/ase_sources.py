"""Where structures come from: the files (and folders of files) :func:`~dali_alchemi.interop.ase_io.convert`
reads, streamed as ``ase.Atoms`` without loading any of them whole.

(Ext)xyz files are parsed by ASE after a pass over their lines at C speed that checks every frame's
atom count (:func:`check_xyz_counts`) and finds where a range of frames starts, so a range is parsed
alone. ASE databases (SQLite ``.db``, ``.json``, PostgreSQL, MySQL) and fairchem's ASE-LMDB files
(``.aselmdb``, through the ``ase-db-backends`` package) are read row by row through ``ase.db``, a page
of rows at a time, with each row's key-value pairs and data in ``atoms.info``. Any other format ASE
reads goes through ``ase.io.iread``. ``ase`` is imported when these functions run.
"""

from __future__ import annotations

import itertools
import os
from collections import deque
from collections.abc import Generator, Iterable, Iterator
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, cast

from dali_alchemi.errors import DaliAlchemiError, InputNotFoundError, SampleDataError

if TYPE_CHECKING:
    from ase import Atoms

__all__ = [
    "DATABASE_FORMATS", "DATABASE_PAGE", "INPUT_SUFFIXES", "MIN_ATOM_LINE_BYTES", "SQLITE_MAGIC", "XYZ_FORMATS",
    "check_xyz_counts", "count_structures", "input_files", "read_structures",
]  # fmt: skip

XYZ_FORMATS = ("xyz", "extxyz")
"""Formats whose frames start with an atom count (checked against the file's size before parsing)."""
MIN_ATOM_LINE_BYTES = 8
"""The shortest line an atom can have in an xyz file (``"H 0 0 0\\n"``)."""
DATABASE_FORMATS = frozenset({"db", "json", "postgresql", "mysql", "aselmdb"})
"""ASE formats read row by row through ``ase.db``, so that key-value pairs and data come along."""
DATABASE_PAGE = 1000
"""Rows of an ASE database fetched per query: memory holds one page, never the whole table."""
SQLITE_MAGIC = b"SQLite format 3\x00"
"""How every SQLite database file starts."""
INPUT_SUFFIXES = (".extxyz", ".xyz", ".aselmdb", ".db")
"""The files a folder given as an input contributes (in sorted order of their names)."""


def input_files(inputs: Iterable[str | Path]) -> list[Path]:
    """The files to read for ``inputs``: each file as given, each folder's :data:`INPUT_SUFFIXES` files
    in sorted order of their names.

    Raises
    ------
    InputNotFoundError
        If an input does not exist, or a folder holds none of those files.
    """
    files = []
    for given in inputs:
        path = Path(given)
        if path.is_dir():
            found = sorted(p for p in path.iterdir() if p.suffix in INPUT_SUFFIXES and p.is_file())
            if not found:
                raise InputNotFoundError(
                    f"Input folder {path} holds no {', '.join('*' + s for s in INPUT_SUFFIXES)} files; "
                    "name the files to convert instead"
                )
            files += found
        elif not path.exists():
            raise InputNotFoundError(f"Input {path} does not exist")
        else:
            files.append(path)
    return files


def read_structures(path: str | Path, *, index: str = ":", format: str | None = None) -> Iterator[Atoms]:
    """Stream ``ase.Atoms`` from any file ASE reads (extxyz, ``.db``, ``.aselmdb``, ``.traj``, ...) without
    loading it whole.

    An ASE database (``.db``, ``.json``, ``.aselmdb``) is read a page of rows at a time, with each row's
    key-value pairs and data in ``atoms.info`` (``ase.io`` leaves them out). The frame headers of an
    (ext)xyz file are checked first (:func:`check_xyz_counts`), so a header claiming more atoms than the
    file holds is refused before ASE starts parsing. ``index="start:stop"`` (non-negative, no step)
    reads only those frames: an xyz file's earlier frames are skipped by counting lines, a database's
    rows are selected by position. Other indexes are passed to ``ase.io.iread``.

    Raises
    ------
    InputNotFoundError
        If the file does not exist.
    SampleDataError
        If an xyz frame claims more atoms than the rest of the file can hold, or a structure cannot be
        read (naming the file and the frame), or a database file is not one.
    """
    kind = _kind(path, format)
    span = _frame_range(index)
    if kind in DATABASE_FORMATS and span is not None:
        return _named(path, _database_rows(path, kind, *span), span[0])
    if kind in XYZ_FORMATS and span is not None and span != (0, None) and not _compressed(path):
        return _named(path, _xyz_range(path, kind, *span), span[0])
    if kind in XYZ_FORMATS:
        check_xyz_counts(path)
    from ase.io import iread

    first = span[0] if span is not None else 0
    return _named(path, iread(str(path), index=index, format=format), first)


def count_structures(path: str | Path) -> int:
    """The number of structures :func:`read_structures` yields for ``path`` with ``index=":"``.

    An xyz file's frames are counted by :func:`check_xyz_counts` (no parsing), a database's rows by the
    database; any other format (and a compressed xyz file) is read through once.

    Raises
    ------
    InputNotFoundError
        If the file does not exist.
    SampleDataError
        If an xyz frame claims more atoms than the rest of the file can hold, a structure cannot be read,
        or a database file is not one.
    """
    kind = _kind(path, None)
    if kind in XYZ_FORMATS and not _compressed(path):
        return check_xyz_counts(path)
    if kind in DATABASE_FORMATS:
        with _connect(path, kind) as db:
            try:
                return int(db.count())
            except Exception as err:  # sqlite3.DatabaseError, lmdb.Error, ...
                raise SampleDataError(f"{path}: its rows cannot be counted: {type(err).__name__}: {err}") from err
    return sum(1 for _ in read_structures(path))


def check_xyz_counts(path: str | Path) -> int:
    """Check every frame's atom count against what is left of the file; return the number of frames.

    One pass over the lines at C speed (no parsing), before ASE's: a count that ``MIN_ATOM_LINE_BYTES``
    bytes per atom line could not fit in the rest of the file (a header claiming 10^12 atoms) is refused,
    where ASE would go on reading for ever, and so is a blank line between frames (where ASE's parser
    stops without a word, leaving out the frames after it). A frame that does not start with a count
    is left for ASE to report. Compressed files are not checked.

    Raises
    ------
    SampleDataError
        Naming the file, the frame and the claimed count (or the blank line before the frame).
    """
    if _compressed(path):
        return 0
    return sum(1 for _ in _xyz_frame_starts(path))


def _xyz_frame_starts(path: str | Path) -> Generator[int, None, None]:
    """The byte offset of each frame of an xyz file, each frame's count checked (see :func:`check_xyz_counts`)."""
    size = os.path.getsize(path)
    frames = 0
    blank = False
    with open(path, "rb") as fh:
        while True:
            start = fh.tell()
            line = fh.readline()
            if not line:
                return
            if not line.strip():
                blank = frames > 0
                continue
            try:
                count = int(line.split()[0])
            except ValueError:
                return  # not a count: ASE's parser reports it
            if blank:
                raise SampleDataError(
                    f"{path}: a blank line before frame {frames} ends the file for ASE's extxyz parser, which would "
                    f"leave out frame {frames} and every frame after it; remove the blank line"
                )
            fh.readline()  # the comment line
            left = size - fh.tell()
            if count < 0 or count * MIN_ATOM_LINE_BYTES > left:
                raise SampleDataError(
                    f"{path}: frame {frames} claims {count:,} atoms, but only {left:,} bytes follow its header "
                    f"(at least {MIN_ATOM_LINE_BYTES} per atom line); the file is truncated or its header is wrong"
                )
            deque(itertools.islice(fh, count), maxlen=0)
            frames += 1
            yield start


def _xyz_range(path: str | Path, kind: str, start: int, stop: int | None) -> Iterator[Atoms]:
    """Frames ``start:stop`` of an xyz file: found by counting lines, and only they are parsed by ASE."""
    from ase.io import iread

    if stop is not None and stop <= start:
        return
    offsets = _xyz_frame_starts(path)
    begin = next(itertools.islice(offsets, start, None), None)
    if begin is None:
        return
    end = None if stop is None else next(itertools.islice(offsets, stop - start - 1, None), None)
    offsets.close()
    with open(path, "rb") as fh:
        yield from iread(cast(IO[str], _Window(fh, begin, end)), index=":", format=kind)


class _Window:
    """The bytes ``begin:end`` of a binary file, read as text lines by ASE's xyz parsers (which seek
    to what they take as the file's start, and read lines until the end)."""

    def __init__(self, fh: IO[bytes], begin: int, end: int | None) -> None:
        self._fh, self._begin, self._end = fh, begin, end
        self._lines = iter(self.readline, "")
        fh.seek(begin)

    def tell(self) -> int:
        return self._fh.tell() - self._begin

    def seek(self, offset: int) -> int:
        return self._fh.seek(self._begin + offset) - self._begin

    def readline(self) -> str:
        if self._end is not None and self._fh.tell() >= self._end:
            return ""
        return self._fh.readline().decode()

    def readlines(self) -> list[str]:
        return list(self)

    def read(self) -> str:
        return "".join(self)

    def __iter__(self) -> Iterator[str]:
        return self

    def __next__(self) -> str:
        return next(self._lines)


def _database_rows(path: str | Path, kind: str, start: int = 0, stop: int | None = None) -> Iterator[Atoms]:
    """Rows ``start:stop`` of an ASE database as ``ase.Atoms``, fetched :data:`DATABASE_PAGE` rows at a time."""
    with _connect(path, kind) as db:
        if kind == "aselmdb":  # rows are fetched one by one by id
            for row_id in db.ids[start:stop]:
                yield db.get(id=row_id).toatoms(add_additional_information=True)
            return
        # SQLite walks its rowids in order (asking for sort="id" would sort every remaining row per page)
        order = "id" if kind in ("postgresql", "mysql") else None
        last = None
        while stop is None or start < stop:
            limit = DATABASE_PAGE if stop is None else min(DATABASE_PAGE, stop - start)
            if kind == "json":  # the whole file is parsed at every query: one query
                limit = 0 if stop is None else stop - start
            rows = db.select(None if last is None else f"id>{last}", limit=limit, offset=start if last is None else 0,
                             sort=order)  # fmt: skip
            fetched = 0
            for row in rows:
                fetched += 1
                last = row.id
                yield row.toatoms(add_additional_information=True)
            if fetched < limit or kind == "json":
                return
            start += fetched


def _connect(path: str | Path, kind: str) -> Any:
    """An ``ase.db`` connection to an existing database (a LMDB file read-only, without lock files)."""
    import ase.db

    name = str(path)
    try:
        if kind == "aselmdb":
            _check_lmdb_size(name)
            return ase.db.connect(name, type="aselmdb", readonly=True)
        if kind == "db" and _head(name, len(SQLITE_MAGIC)) != SQLITE_MAGIC:
            raise SampleDataError(f"{path} is not an SQLite database (it does not start with {SQLITE_MAGIC!r})")
        if kind in ("db", "json"):
            return ase.db.connect(name, type=kind, serial=True)
        return ase.db.connect(name, serial=True)
    except (DaliAlchemiError, ImportError):
        raise
    except Exception as err:  # lmdb.Error, sqlite3.DatabaseError, a JSON error, ...
        raise SampleDataError(
            f"{path} cannot be opened as an ASE {kind} database: {type(err).__name__}: {err}"
        ) from err


def _check_lmdb_size(name: str) -> None:
    """Refuse a LMDB file shorter than its own pages say (a download cut short), which LMDB would read as
    empty or crash the process on; opened here, not by ase-db-backends (which fails again on closing)."""
    import lmdb

    env = lmdb.open(name, subdir=False, readonly=True, lock=False)
    try:
        needed = (env.info()["last_pgno"] + 1) * env.stat()["psize"]
    finally:
        env.close()
    size = os.path.getsize(name)
    if size < needed:
        raise SampleDataError(
            f"{name} is truncated: its pages need {needed:,} bytes, the file holds {size:,} (a download or copy "
            "cut short?); fetch it again"
        )


def _named(path: str | Path, structures: Iterator[Atoms], first: int) -> Iterator[Atoms]:
    """``structures`` (frames ``first``, ``first + 1``, ... of ``path``), a failure to read one naming the
    file and the frame."""
    frame = first
    while True:
        try:
            atoms = next(structures)
        except StopIteration:
            return
        except (DaliAlchemiError, OSError, MemoryError):
            raise
        except Exception as err:  # ASE's parsers raise many kinds
            raise SampleDataError(
                f"{path}: frame {frame} (counted from 0) cannot be read: {type(err).__name__}: {err}; fix that "
                "frame or leave the file out"
            ) from err
        yield atoms
        frame += 1


def _kind(path: str | Path, format: str | None) -> str:
    """The ASE format of ``path`` (``"aselmdb"`` for fairchem's ASE-LMDB files, which ASE calls ``"db"``)."""
    _exists(path)
    if format is not None:
        return format
    if str(path).endswith(".aselmdb"):
        return "aselmdb"
    from ase.io.formats import filetype

    try:
        return str(filetype(str(path)))
    except Exception as err:  # ase.io.formats.UnknownFileTypeError, an empty file, ...
        raise SampleDataError(f"{path}: ASE cannot tell its format: {err}") from err


def _exists(path: str | Path) -> None:
    """Refuse a local input that does not exist, or is an empty file (which SQLite would make a database of)."""
    name = str(path)
    if name.startswith(("postgresql://", "postgres://", "mysql://", "mariadb://")):
        return
    if not os.path.exists(name):
        raise InputNotFoundError(f"Input {path} does not exist")
    if os.path.isfile(name) and os.path.getsize(name) == 0:
        raise SampleDataError(f"{path} is empty: it holds no structures; leave it out")


def _frame_range(index: str) -> tuple[int, int | None] | None:
    """``index`` as ``(start, stop)`` when it is ``"start:stop"`` with non-negative bounds and no step."""
    parts = index.split(":")
    if len(parts) != 2 or not all(p.strip().isdigit() or not p.strip() for p in parts):
        return None
    start = int(parts[0]) if parts[0].strip() else 0
    stop = int(parts[1]) if parts[1].strip() else None
    return start, stop


def _compressed(path: str | Path) -> bool:
    return _head(path, 2) in (b"\x1f\x8b", b"BZ")  # gzip, bzip2: sizes say nothing


def _head(path: str | Path, size: int) -> bytes:
    with open(path, "rb") as fh:
        return fh.read(size)
