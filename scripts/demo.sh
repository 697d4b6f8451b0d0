#!/usr/bin/env bash
# The main job: a real federated comparison on FashionMNIST (heterogeneous split over 10 clients, the papers' MLP):
# IVON-ADMM, FedDyn and FedAvg for the first few rounds of the papers' 50-round schedule (stop_at, so IVON-ADMM's
# cosine lr decay is the one over 50 rounds, not squeezed into the few run), then the comparison table and the
# overlay plot. Usage: scripts/demo.sh [OUT_DIR] [ROUNDS]   (defaults: runs/demo, 6)
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-runs/demo}
ROUNDS=${2:-6}
BIN=${VENV:-.venv}/bin/bayesadmm
for method in ivon-admm feddyn fedavg; do
  echo "== $method: fmnist-heterog10, the first $ROUNDS of 50 rounds"
  # --overwrite: running the demo again replaces its own earlier runs (a run directory is otherwise never replaced)
  "$BIN" run fmnist-heterog10 method=$method stop_at=$ROUNDS seed=0 out="$OUT/$method" --overwrite
done
echo "== comparison (mean of the last 3 rounds; one seed, so ± is 0)"
"$BIN" compare "$OUT"/ivon-admm "$OUT"/feddyn "$OUT"/fedavg --rounds "$((ROUNDS / 2)),$ROUNDS" --out "$OUT"
echo "plot: $OUT/curves.png"
