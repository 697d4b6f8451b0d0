# `make demo` and `make test` set everything up themselves (scripts/setup.sh), then run. `make test` lints and
# type-checks src/ (ruff, mypy) and builds the documentation site (mkdocs, warnings are errors) before the test
# suite; there tests/test_docs_browser.py opens every page of the site in headless Chromium (skipped, with the reason,
# where Chromium is missing) and leaves screenshots of the home and results pages in build/docs-screenshots/.
# `make docs` serves the site at http://127.0.0.1:8000 and rebuilds it on every edit.
VENV ?= .venv
PY := $(VENV)/bin/python
OUT ?= runs/demo
# the tests spread over the cores (pytest-xdist: a worker per core, at most 4, each taking whole test files so that a
# file's shared fixtures are built once); PARALLEL= runs them in one process
PARALLEL ?= -n auto --maxprocesses 4 --dist loadfile

.PHONY: setup demo test test-fast docs figures results-tables

setup:
	@VENV=$(VENV) bash scripts/setup.sh

demo: setup
	@VENV=$(VENV) bash scripts/demo.sh $(OUT)

test: setup
	$(PY) -m ruff check src
	$(PY) -m ruff format --check src
	$(PY) -m mypy src/bayesadmm
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict --site-dir build/site
	$(PY) -m pytest $(PARALLEL) -rs --durations=15

# the tests without the long end-to-end ones (marked slow), for the edit-test loop
test-fast: setup
	$(PY) -m pytest $(PARALLEL) -m "not slow" --durations=10

docs: setup
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs serve

figures: setup
	$(VENV)/bin/bayesadmm paper onestep --out docs/figures
	$(VENV)/bin/bayesadmm paper logreg --out docs/figures
	$(VENV)/bin/bayesadmm paper outlier --out docs/figures
	$(VENV)/bin/bayesadmm paper fedep-toy --out docs/figures

results-tables: setup
	$(PY) scripts/results_tables.py
