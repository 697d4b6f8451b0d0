#!/usr/bin/env bash
# The main job: a real federated comparison on FashionMNIST (heterogeneous split over 10 clients, the papers' MLP,
# their 50-round schedule): IVON-ADMM, FedDyn and FedAvg as one `bayesadmm sweep`, then the table at rounds 10, 25
# and 50 and the overlay plot. Usage: scripts/demo.sh [OUT_DIR] [ROUNDS]   (defaults: runs/demo, 50; fewer rounds
# stop the papers' schedule early with stop_at, so IVON-ADMM's cosine decay still spans 50 rounds).
# Run again, it skips the runs that are complete and resumes interrupted ones.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-runs/demo}
ROUNDS=${2:-50}
BIN=${VENV:-.venv}/bin/bayesadmm
STOP=()
if [ "$ROUNDS" -lt 50 ]; then STOP=("stop_at=$ROUNDS"); fi
"$BIN" sweep fmnist-heterog10 method=ivon-admm,feddyn,fedavg seed=0 "${STOP[@]}" --out "$OUT" \
  --at "$((ROUNDS / 5)),$((ROUNDS / 2)),$ROUNDS"
echo "table: $OUT/table.md; plot: $OUT/curves.png"
