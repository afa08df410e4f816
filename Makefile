# Every target installs what it needs first: a fresh clone needs only Python 3.11+ and make.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# torch as the package index serves it: PyPI's Linux wheels are CUDA builds (several GB). For a CPU build,
# make install TORCH_INDEX=https://download.pytorch.org/whl/cpu; for another version, TORCH_SPEC=torch==X.
TORCH_SPEC ?= torch==2.13.0
TORCH_INDEX ?=
STAMP := $(VENV)/.installed
BENCH_ARGS ?=
# Tests run in one pytest worker per core (pytest-xdist), each test file whole in one worker.
TEST_ARGS ?= -n auto --dist loadfile

.PHONY: install test stress test-under-load demo notebooks lint bench gpu-check parity clean

install: $(STAMP)

$(STAMP): pyproject.toml
	@echo "make install: $(TORCH_SPEC)$(if $(TORCH_INDEX), from $(TORCH_INDEX)), DALI, zarr and the dev tools into $(VENV), with no output until done. $(if $(TORCH_INDEX),With the CPU build: about 0.9 GB to download and 2.7 GB on disk.,About 3.4 GB to download and 6.8 GB on disk (PyPI's torch is a CUDA build); TORCH_INDEX=https://download.pytorch.org/whl/cpu gets the CPU build: 0.9 GB and 2.7 GB.) A few minutes on a fast connection."
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX)) "$(TORCH_SPEC)"
	$(BIN)/python -m pip install --quiet -e ".[dev]"
	touch $(STAMP)

test: install
	$(BIN)/python -m pytest $(TEST_ARGS)

# The long randomised runs that `make test` leaves out: 100 random Ctrl-Cs, random kills, deep fuzzing.
stress: install
	$(BIN)/python -m pytest -m stress $(TEST_ARGS)

# `make test` RUNS times (default 3) while BUSY processes (default: one per core) keep every core busy.
test-under-load: install
	bash scripts/test-under-load.sh

demo: install
	$(BIN)/dali-alchemi bench --rounds 1 --json bench-results/demo.json --plot bench-results/demo.png $(BENCH_ARGS)

# Runs the three notebooks end to end (executed copies in bench-results/notebooks/) and removes their stores.
notebooks: install
	$(BIN)/python scripts/run_notebooks.py bench-results/notebooks

lint: install
	$(BIN)/ruff check dali_alchemi tests examples scripts tools
	$(BIN)/mypy

bench: install
	$(BIN)/dali-alchemi bench --n 20000 --rounds 3 --json bench-results/bench.json --plot bench-results/bench.png $(BENCH_ARGS)

# Needs a CUDA build of torch (PyPI's Linux wheels are): make gpu-check VENV=.venv-cuda TORCH_SPEC=torch
gpu-check: install
	bash scripts/gpu-check.sh $(BIN)/python

# Parity with nvalchemi-toolkit 0.2.0 in its own environment (it brings a CUDA build of torch and warp).
parity:
	$(PYTHON) -m venv .venv-nvalchemi
	.venv-nvalchemi/bin/python -m pip install --quiet --upgrade pip
	.venv-nvalchemi/bin/python -m pip install --quiet -e ".[dev,nvalchemi]"
	.venv-nvalchemi/bin/python -m pytest -q tests/parity tests/interop/test_frameworks.py tests/test_docs.py

clean:
	rm -rf $(VENV) .venv-nvalchemi .pytest_cache .ruff_cache .mypy_cache .hypothesis bench-results
