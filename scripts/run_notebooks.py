"""Run every notebook in ``notebooks/`` end to end, as ``make notebooks`` does, and leave nothing behind.

Each notebook runs in a kernel whose temporary folder is a fresh directory, removed afterwards (the
notebooks also remove their own stores). The executed copies, outputs included, go to ``OUT``
(default ``bench-results/notebooks``); the committed notebooks stay without outputs.

    python scripts/run_notebooks.py [OUT] [--only 01_explore_store.ipynb ...]

``NB_STRUCTURES``, ``NB_ROUNDS`` and ``NB_STEPS`` in the environment set the sizes, as in each notebook.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import nbclient
import nbformat

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"


def run(book_path: Path, out_dir: Path) -> float:
    """Execute one notebook in a scratch folder; seconds taken. Raises on the first failing cell."""
    book = nbformat.read(book_path, as_version=4)
    scratch = Path(tempfile.mkdtemp(prefix="notebook-"))
    old_tmpdir = os.environ.get("TMPDIR")
    os.environ["TMPDIR"] = str(scratch)  # the kernel inherits it: its stores land in scratch
    start = time.perf_counter()
    try:
        client = nbclient.NotebookClient(
            book, timeout=1800, kernel_name="python3", resources={"metadata": {"path": str(scratch)}}
        )
        client.execute()
    finally:
        if old_tmpdir is None:
            os.environ.pop("TMPDIR", None)
        else:
            os.environ["TMPDIR"] = old_tmpdir
        shutil.rmtree(scratch, ignore_errors=True)
        nbformat.write(book, out_dir / book_path.name)
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", nargs="?", default="bench-results/notebooks", help="where the executed copies go")
    parser.add_argument("--only", nargs="+", default=None, help="notebook file names to run (default: all)")
    args = parser.parse_args(argv)
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    books = sorted(NOTEBOOKS.glob("*.ipynb"))
    if args.only:
        unknown = sorted(set(args.only) - {b.name for b in books})
        if unknown:
            print(f"error: no such notebook: {', '.join(unknown)} (have {', '.join(b.name for b in books)})")
            return 2
        books = [b for b in books if b.name in args.only]
    for book in books:
        try:
            seconds = run(book, out_dir)
        except nbclient.exceptions.CellExecutionError as err:
            print(f"{book.name}: failed (executed copy in {out_dir / book.name})\n{err}")
            return 1
        print(f"{book.name}: ran in {seconds:.1f} s -> {out_dir / book.name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
