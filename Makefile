# The two commands a new user needs: `make demo` and `make test`.
# Both create the virtual environment on first use. torch is pinned and installed
# first, on its own, so that pip never resolves a newer torch (several GB of CUDA).
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.shoal-installed
TORCH  := torch==2.13.0

.PHONY: setup demo demo-dp test lint typecheck docs docs-serve bench bench-kge bench-ps bench-pbg clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check $(TORCH)
	$(PY) -m pip install --quiet --disable-pip-version-check -e ".[dev]" $(TORCH)
	touch $(STAMP)

demo: setup
	$(VENV)/bin/shoal train examples/kge-kinships-ps.toml

demo-dp: setup
	$(VENV)/bin/shoal train examples/demo.toml

test: setup
	$(PY) -m pytest -q

lint: setup
	$(VENV)/bin/ruff check src tests benchmarks docs/hooks
	$(VENV)/bin/ruff format --check src tests benchmarks docs/hooks

typecheck: setup
	$(VENV)/bin/mypy
	$(VENV)/bin/mypy docs/hooks

# the documentation site into site/ (strict: a broken link fails), or served with live reload
docs: setup
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build

docs-serve: setup
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs serve

bench: setup
	$(PY) benchmarks/dp_vs_ddp.py

bench-kge: setup
	$(PY) benchmarks/kge_vs_pykeen.py

bench-ps: setup
	$(PY) benchmarks/kge_ps_scaling.py

# PyTorch-BigGraph side by side: the script creates PBG's own venv (.venv-pbg) on first use
bench-pbg: setup
	$(PY) benchmarks/kge_vs_pbg.py --setup-only
	$(PY) benchmarks/kge_vs_pbg.py

clean:
	rm -rf $(VENV) .venv-pbg runs site .pytest_cache .mypy_cache .ruff_cache
