#!/usr/bin/env bash
# Sets up everything the project needs, idempotently: a virtual environment (.venv, or $VENV) with the CPU build of
# torch, the package with its test dependencies, and FashionMNIST (Debian package dataset-fashion-mnist) where the
# machine has apt and we are root. Called by `make demo` and `make test`, so a fresh clone needs nothing else.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
PY="$VENV/bin/python"

if [ ! -x "$PY" ]; then
  echo "setup: creating $VENV"
  python3 -m venv "$VENV"
fi
if ! "$PY" -c "import torch" 2>/dev/null; then
  # Pinned on purpose: 2.13.0 is the CPU build that lies on this kind of machine's disk; an unpinned `torch` would
  # pull a CUDA build of several GB. Any torch >= 2.4 works if you install it yourself first.
  echo "setup: installing torch==2.13.0"
  "$PY" -m pip install --quiet --disable-pip-version-check torch==2.13.0
fi
stamp="$VENV/.bayesadmm-installed"
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  echo "setup: installing bayesadmm and its test dependencies"
  "$PY" -m pip install --quiet --disable-pip-version-check -e ".[test]"
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
