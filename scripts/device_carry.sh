#!/usr/bin/env bash
# Makes .carry/ for scripts/device_check.sh on a GPU machine that has torch but neither Flower nor ivon-opt and no
# network (the `device` tool's image: Python 3.12, x86-64): a site-packages folder of flwr[simulation] 1.42.0 (with
# Ray) and ivon-opt 0.1.3 for that Python, packed as .carry/site.tar.xz (about 34 MB), and FashionMNIST's label files.
#
#     bash scripts/device_carry.sh [PYTHON_VERSION]     # default 3.12; needs pip, xz and the package registry
#
# To fit the device tool's 64 MiB, what the peers do not use is left out: numpy (the image has it), the uv and
# script binaries, Ray's Java jars, dashboard front-end and its libraries for RLlib, Serve, Data and LLMs, and the
# symbols of the compiled libraries (strip).
set -euo pipefail
cd "$(dirname "$0")/.."
version=${1:-3.12}
site=$(mktemp -d)
trap 'rm -rf "$site"' EXIT
python3 -m pip install --quiet --disable-pip-version-check --target "$site" --python-version "$version" \
  --implementation cp --only-binary=:all: --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 "flwr[simulation]==1.42.0" "ivon-opt==0.1.3"
rm -rf "$site"/numpy "$site"/numpy.libs "$site"/numpy-* "$site"/bin "$site"/uv "$site"/uv-* "$site"/uvloop* \
  "$site"/ray/jars "$site"/ray/rllib "$site"/ray/serve "$site"/ray/llm "$site"/ray/data \
  "$site"/ray/dashboard/client/build
find "$site" -name __pycache__ -prune -exec rm -rf {} +
find "$site" -name '*.so' -size +1M -exec strip --strip-unneeded {} + 2>/dev/null || true
strip --strip-unneeded "$site"/ray/core/src/ray/gcs/gcs_server "$site"/ray/core/src/ray/raylet/raylet
mkdir -p .carry/fashion-mnist
tar -C "$site" -cf - . | xz -9 -T0 >.carry/site.tar.xz
labels=/usr/share/datasets/fashion-mnist
if [ -f "$labels/train-labels-idx1-ubyte.gz" ]; then
  cp "$labels"/*-labels-idx1-ubyte.gz .carry/fashion-mnist/
fi
grep -qx '/.carry/' .git/info/exclude 2>/dev/null || echo '/.carry/' >>.git/info/exclude
du -sh .carry
