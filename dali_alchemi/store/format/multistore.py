"""A multi-store: one dataset kept as a folder of part stores and a manifest that orders them.

A parallel conversion writes each of its work units (an input file's structures ``start:stop``) into
a part store of its own. The parts cannot be joined into one store by metadata alone: a zarr array
has one regular chunk grid, so rows of part 2 can follow those of part 1 in one array only if part
1 ends on a chunk (and shard) boundary, which structure counts that vary in atoms never do. So the
parts stay as they are, each a normal store, and ``manifest.json`` beside them says which parts make
the dataset and in what order; readers open the folder as one dataset (global indices over the
parts in order, no ``dataset_id``).

The manifest (JSON, written atomically: a sibling file renamed over it) holds the format and its
version, whether the job finished (``complete``), the options and inputs (path, size, modification
time) that produced the parts, and per part its name, input, range, structure count and conversion
report: what a rerun of the same job compares to skip the parts already done.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from dali_alchemi.errors import StoreFormatError

__all__ = ["MANIFEST_NAME", "MULTISTORE_FORMAT", "MULTISTORE_VERSION", "is_multistore", "read_manifest",
           "write_manifest"]  # fmt: skip

MANIFEST_NAME = "manifest.json"
MULTISTORE_FORMAT = "dali-alchemi-multistore"
MULTISTORE_VERSION = 1


def is_multistore(path: Any) -> bool:
    """Whether ``path`` is a local folder holding a multi-store manifest (anything else: ``False``)."""
    if not isinstance(path, (str, os.PathLike)) or "://" in str(path):
        return False
    return (Path(path) / MANIFEST_NAME).is_file()


def read_manifest(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The manifest of the multi-store at ``path``, checked for its format and version.

    Raises
    ------
    StoreFormatError
        If the manifest is not JSON, is another format, or a version this code does not read.
    """
    file = Path(path) / MANIFEST_NAME
    try:
        manifest = json.loads(file.read_text())
    except (OSError, ValueError) as err:
        raise StoreFormatError(f"{file}: not a readable multi-store manifest ({err})") from err
    if not isinstance(manifest, dict) or manifest.get("format") != MULTISTORE_FORMAT:
        raise StoreFormatError(f"{file}: not a multi-store manifest (no format {MULTISTORE_FORMAT!r})")
    if manifest.get("version") != MULTISTORE_VERSION:
        raise StoreFormatError(
            f"{file}: multi-store version {manifest.get('version')!r}; this dali-alchemi reads version "
            f"{MULTISTORE_VERSION}: upgrade dali-alchemi"
        )
    return manifest


def write_manifest(path: str | os.PathLike[str], manifest: dict[str, Any]) -> None:
    """Write ``manifest`` into the folder ``path`` atomically: a reader sees the old one or the new one."""
    file = Path(path) / MANIFEST_NAME
    staged = file.with_name(f".{MANIFEST_NAME}.{os.getpid()}.tmp")
    body = {"format": MULTISTORE_FORMAT, "version": MULTISTORE_VERSION, **manifest}
    with open(staged, "w") as fh:
        json.dump(body, fh, indent=1)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(staged, file)
