"""The notebooks run end to end at small sizes, so they never rot."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("01_explore_store.ipynb", ["meta", "batch_ptr: [0,", "structures, ", "local neighbor_list"]),
        ("02_throughput.ipynb", ["dali ", "torch-batched-w0", "structures/s", "of limit"]),
        ("03_train_with_dali.ipynb", ["structures,", "edges; fields:", "batches per epoch", "loss: first"]),
    ],
)
def test_notebook_executes(
    name: str, expected: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest
) -> None:
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    monkeypatch.setenv("NB_STRUCTURES", "400")
    monkeypatch.setenv("NB_ROUNDS", "1")
    monkeypatch.setenv("NB_STEPS", "30")
    # where the kernel's tempfile.mkdtemp() writes: a short path of its own, since multiprocessing puts the
    # AF_UNIX sockets that pass tensors between processes (a DataLoader's workers) under it, and a socket
    # path over 107 bytes cannot be bound (pytest's own tmp_path under xdist is long enough to reach it)
    scratch = Path(tempfile.mkdtemp(prefix="nb-"))
    request.addfinalizer(lambda: shutil.rmtree(scratch, ignore_errors=True))
    monkeypatch.setenv("TMPDIR", str(scratch))
    # torch's own compile cache (importing torch._dynamo, as an optimizer step does, creates it under
    # TMPDIR) is not something the notebook wrote: keep it out of the folder checked for leftovers.
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "torch-cache"))
    if name.startswith("03"):
        pytest.importorskip("ase")
        monkeypatch.setenv("NB_STRUCTURES", "120")
    book = nbformat.read(NOTEBOOKS / name, as_version=4)
    assert all(not cell.get("outputs") for cell in book.cells if cell.cell_type == "code"), (
        "commit notebooks without outputs"
    )
    client = nbclient.NotebookClient(
        book, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    )
    client.execute()
    text = "\n".join(
        out.get("text", "") + str(out.get("data", {}).get("text/plain", ""))
        for cell in book.cells
        if cell.cell_type == "code"
        for out in cell.get("outputs", [])
    )
    for snippet in expected:
        assert snippet in text, f"{name}: {snippet!r} not in the output"
    images = [out for cell in book.cells for out in cell.get("outputs", []) if "image/png" in out.get("data", {})]
    assert images, f"{name} produced no figure"
    assert list(scratch.iterdir()) == [], f"{name} left files behind"
