"""The README and the user guide in docs/: every relative link resolves, every Python block runs.

A page's Python blocks run in order in one namespace, in a folder that holds the small stores they
name (``train.zarr`` and the others of :data:`STORES`) and the few names they take as given
(:func:`_given`). A block that needs what this environment may lack says so on the line before it:
``<!-- needs: nvalchemi -->`` (it runs where nvalchemi-toolkit imports: ``make parity`` runs this file
too), ``<!-- needs: cuda -->``, or both. A block that cannot run in a test at all (a cloud bucket) says why, as
``<!-- not run: why -->``; its imports of this package are still checked.
"""

from __future__ import annotations

import importlib.util
import re
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from dali_alchemi.bench.synth import synthetic_samples, write_synthetic_store

ROOT = Path(__file__).resolve().parents[1]
PAGES = sorted([ROOT / "README.md", *(ROOT / "docs").glob("*.md")])
STORES = {"train.zarr": 96, "bulk.zarr": 64, "surfaces.zarr": 32}
"""The stores the blocks read, with their sizes: small, so that every block runs in seconds."""
GROWN = ROOT / "tests" / "fixtures" / "nvalchemi-0.2.0" / "nv_append_batch.zarr"
"""``grown.zarr`` of the repair example: a store nvalchemi 0.2.0 grew by appending batches."""

FENCE = re.compile(r"^```(\w*)\n(.*?)^```\n", re.M | re.S)
NOT_RUN = re.compile(r"<!-- not run: (.+?) -->\s*$")
NEEDS = re.compile(r"<!-- needs: ([\w ]+?) -->\s*$")
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def _available(need: str) -> bool:
    if need == "nvalchemi":
        return importlib.util.find_spec("nvalchemi") is not None
    if need == "cuda":
        import torch

        return torch.cuda.is_available()
    raise AssertionError(f"unknown need {need!r} in a docs block (nvalchemi or cuda)")


def _blocks(page: Path) -> list[tuple[int, str, str | None]]:
    """Each Python block of ``page``: its line, its code, and why it is not run here (None: it runs)."""
    text = page.read_text()
    found = []
    for match in FENCE.finditer(text):
        if match.group(1) != "python":
            continue
        before = text[: match.start()].rstrip("\n").rsplit("\n", 1)[-1]
        reason = NOT_RUN.search(before)
        why = reason.group(1) if reason else None
        need = NEEDS.search(before)
        missing = [n for n in need.group(1).split() if not _available(n)] if need else []
        if missing:
            why = f"needs {' and '.join(missing)}"
        found.append((text.count("\n", 0, match.start()) + 1, match.group(2), why))
    return found


def _anchors(page: Path) -> set[str]:
    """The anchors GitHub gives the headings of ``page``."""
    text = FENCE.sub("", page.read_text())
    anchors = set()
    for heading in re.findall(r"^#{1,6} (.+)$", text, re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.lower().replace("`", "")).replace(" ", "-")
        anchors.add(slug)
    return anchors


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_relative_link_resolves(page: Path) -> None:
    text = FENCE.sub("", page.read_text())
    for target in LINK.findall(text):
        if re.match(r"^[a-z]+://|^mailto:", target):
            continue
        path, _, anchor = target.partition("#")
        resolved = (page.parent / path).resolve() if path else page
        assert resolved.exists(), f"{page.name} links to {target}, which does not exist"
        if anchor and resolved.suffix == ".md":
            assert anchor in _anchors(resolved), f"{page.name} links to {target}: no such heading in {resolved.name}"


def test_the_guide_is_linked_from_the_readme() -> None:
    readme = (ROOT / "README.md").read_text()
    for page in (ROOT / "docs").glob("*.md"):
        assert f"(docs/{page.name})" in readme, f"the README does not link docs/{page.name}"


def test_the_readme_is_one_screen_of_paths() -> None:
    assert len((ROOT / "README.md").read_text().splitlines()) <= 250


@pytest.fixture(scope="module")
def stores(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("docs-stores")
    for seed, (name, n) in enumerate(STORES.items()):
        write_synthetic_store(folder / name, n, seed=seed, min_atoms=4, max_atoms=24)
    return folder


class MyModel(torch.nn.Module):
    """A stand-in for the user's model in the padding example: energies from atomic numbers."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(100, 1)

    def forward(self, z: Any, pos: Any, edges: Any, batch_idx: Any, n_graphs: int) -> Any:
        per_atom = self.embed(z).squeeze(-1) + 0.0 * pos.sum(-1)
        return torch.zeros(n_graphs, dtype=per_atom.dtype).index_add(0, batch_idx.long(), per_atom)


def _given() -> dict[str, Any]:
    """The names the blocks take as given: the user's structures, model, rank and energies."""
    samples, more_samples = synthetic_samples(8, 3, 4, 12).split(), synthetic_samples(4, 4, 4, 12).split()
    return {
        "samples": samples,
        "more_samples": more_samples,
        "tags": np.arange(len(samples) + len(more_samples), dtype=np.int64),  # after the append
        "MyModel": MyModel,
        "rank": 0,
        "world": 1,
        "energy": np.random.default_rng(0).normal(size=STORES["train.zarr"]),
    }


def _pages_with_blocks() -> list[Path]:
    return [page for page in PAGES if _blocks(page)]


@pytest.mark.dali
@pytest.mark.timeout(600)
@pytest.mark.parametrize("page", _pages_with_blocks(), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_python_block_runs(page: Path, stores: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("nvidia.dali", reason="NVIDIA DALI cannot be imported")
    for name in STORES:
        shutil.copytree(stores / name, tmp_path / name)
    shutil.copytree(GROWN, tmp_path / "grown.zarr")
    monkeypatch.chdir(tmp_path)
    namespace = _given()
    ran = 0
    for line, code, reason in _blocks(page):
        if reason is not None:
            if reason.startswith("needs "):
                continue  # its imports need what is missing too
            for statement in re.findall(r"^(?:from dali_alchemi[\w.]* import [\w, ]+|import dali_alchemi\S*)$", code, re.M):
                exec(statement, {})  # a block that cannot run here still imports what exists
            continue
        try:
            exec(compile(code, f"{page.name}:{line}", "exec"), namespace)
        except Exception as err:
            pytest.fail(f"{page.relative_to(ROOT)} line {line}: {type(err).__name__}: {err}")
        ran += 1
        loader = namespace.get("loader")
        if loader is not None and hasattr(loader, "close"):
            loader.close()
    reasons = [reason for _, _, reason in _blocks(page) if reason is not None]
    if not ran and reasons and all(r.startswith("needs ") for r in reasons):
        pytest.skip(f"{page.name}: every block {reasons[0]}")
    assert ran, f"{page.name}: every block is marked not run"


def _commands() -> list[tuple[Path, str]]:
    """Every ``dali-alchemi ...`` command line of a bash block, continuation lines joined."""
    found = []
    for page in PAGES:
        for match in FENCE.finditer(page.read_text()):
            if match.group(1) != "bash":
                continue
            text = match.group(2).replace("\\\n", " ")
            for line in text.splitlines():
                line = line.split("#", 1)[0].strip()
                if line.startswith("dali-alchemi "):
                    found.append((page, line))
    return found


def test_every_documented_command_and_option_exists() -> None:
    import argparse

    from dali_alchemi.cli import build_parser

    parser = build_parser()
    subparsers = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    commands = _commands()
    assert len(commands) > 10
    for page, line in commands:
        words = line.split()
        if words[1].startswith("-"):  # dali-alchemi --version
            assert words[1] in parser._option_string_actions, f"{page.name}: {line}"
            continue
        assert words[1] in subparsers.choices, f"{page.name}: no command {words[1]!r} in {line!r}"
        options = subparsers.choices[words[1]]._option_string_actions
        for word in words[2:]:
            option = word.strip("[]").split("=", 1)[0]
            if option.startswith("--"):
                assert option in options, f"{page.name}: {words[1]} has no option {option} ({line!r})"


REPOSITORY_PATH = re.compile(
    r"(?<![\w./-])((?:tests|scripts|dali_alchemi|docs|examples|notebooks|tools)/[\w./*-]*)(::\w+)?"
)
"""A path into this repository as the pages name one (``tests/...``, ``scripts/...``), with an optional ``::test``."""
MAKE_TARGET = re.compile(r"^\s*make ([a-z][\w-]*)", re.M)
"""A ``make`` command: an inline code span or a line of a block that starts with one."""
INLINE_CODE = re.compile(r"`([^`\n]+(?:\n[^`\n]+)*)`")


def _code(page: Path) -> list[str]:
    """The code a page shows: every inline code span (one may wrap a line) and every non-Python block."""
    text = page.read_text()
    blocks = [m.group(2) for m in FENCE.finditer(text) if m.group(1) != "python"]
    return [*INLINE_CODE.findall(FENCE.sub("", text)), *blocks]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_repository_path_in_code_exists(page: Path) -> None:
    stale = []
    for code in _code(page):
        for path, test in REPOSITORY_PATH.findall(code):
            path = path.rstrip(".,:;")
            found = sorted(ROOT.glob(path)) if "*" in path else [ROOT / path] if (ROOT / path).exists() else []
            if not found:
                stale.append(path)
            elif test and not re.search(rf"^\s*(?:async )?def {test[2:]}\(", found[0].read_text(), re.M):
                stale.append(f"{path}{test} (no such test)")
    assert not stale, f"{page.name} names paths that do not exist: {', '.join(stale)}"


def _make_targets() -> set[str]:
    return set(re.findall(r"^([\w-]+):(?!=)", (ROOT / "Makefile").read_text(), re.M))


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_make_target_in_code_is_the_makefiles(page: Path) -> None:
    targets = _make_targets()
    assert {"install", "test", "demo"} <= targets
    named = {target for code in _code(page) for target in MAKE_TARGET.findall(code)}
    if page.name == "README.md":
        assert {"demo", "test", "install", "notebooks"} <= named, "the README's make commands are found"
    assert named <= targets, f"{page.name} names make targets the Makefile lacks: {sorted(named - targets)}"
