"""dali_alchemi.nvalchemi (the drop-in for nvalchemi's datapipes) without nvalchemi-toolkit: a clear error."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

WITHOUT_NVALCHEMI = """
import sys
sys.modules["nvalchemi.data.datapipes"] = None  # its import fails, as when nvalchemi is not installed
from dali_alchemi.errors import NvalchemiNotInstalledError
try:
    import dali_alchemi.nvalchemi
except NvalchemiNotInstalledError as err:
    print(isinstance(err, ImportError), err)
"""


def test_importing_without_nvalchemi_says_how_to_install_it() -> None:
    # In a fresh interpreter, so that this process's own nvalchemi modules stay as they are.
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run(
        [sys.executable, "-c", WITHOUT_NVALCHEMI], capture_output=True, text=True, check=True, env=env, cwd=ROOT
    )
    assert done.stdout.startswith("True dali_alchemi.nvalchemi needs nvalchemi-toolkit 0.2.0"), done.stdout
    assert "pip install nvalchemi-toolkit==0.2.0" in done.stdout


def test_the_module_mirrors_nvalchemis_datapipes() -> None:
    pipes = pytest.importorskip("nvalchemi.data.datapipes", reason="nvalchemi-toolkit is not installed")
    module = importlib.import_module("dali_alchemi.nvalchemi")
    assert set(pipes.__all__) <= set(module.__all__)
    assert module.InMemoryDataset is pipes.InMemoryDataset and module.MultiDataset is pipes.MultiDataset
    assert issubclass(module.Dataset, pipes.Dataset) and module.DataLoader is not pipes.DataLoader
