# `make demo` and `make test` set everything up themselves (scripts/setup.sh), then run. `make test` lints and
# type-checks src/ (ruff, mypy) before the test suite.
VENV ?= .venv
PY := $(VENV)/bin/python
OUT ?= runs/demo

.PHONY: setup demo test figures

setup:
	@VENV=$(VENV) bash scripts/setup.sh

demo: setup
	@VENV=$(VENV) bash scripts/demo.sh $(OUT)

test: setup
	$(PY) -m ruff check src
	$(PY) -m ruff format --check src
	$(PY) -m mypy src/bayesadmm
	$(PY) -m pytest --durations=15

figures: setup
	$(VENV)/bin/bayesadmm paper onestep --out docs/figures
	$(VENV)/bin/bayesadmm paper logreg --out docs/figures
	$(VENV)/bin/bayesadmm paper outlier --out docs/figures
	$(VENV)/bin/bayesadmm paper fedep-toy --out docs/figures
