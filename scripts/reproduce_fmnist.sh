#!/usr/bin/env bash
# The FashionMNIST reproduction (issue #5): every (scenario, method, seed) run of docs/results, one after the other.
#
#   scripts/reproduce_fmnist.sh [RUNS_DIR] [SEEDS] [SCENARIOS] [METHODS]
#
# Extra `bayesadmm run` settings can be passed in $EXTRA (e.g. EXTRA="workers=2 stop_at=25").
# Defaults: runs/fmnist, seeds "0 1 2", the three FashionMNIST scenarios, and each scenario's methods below. A run
# that already completed is skipped and an interrupted one is resumed from its checkpoint, so the script can be
# stopped and restarted at any time. Each run uses one torch thread (the measured seconds per round are per core).
# `scripts/collect_results.sh RUNS_DIR` then copies the small files of each run into docs/results/runs.
set -uo pipefail
cd "$(dirname "$0")/.."
RUNS=${1:-runs/fmnist}
SEEDS=${2:-"0 1 2"}
SCENARIOS=${3:-"fmnist-heterog10 fmnist-homog10 fmnist-heterog100"}
BIN=${BAYESADMM:-.venv/bin/bayesadmm}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}

methods_for() {
  case "$1" in
    fmnist-heterog100) echo "ivon-admm feddyn fedavg" ;;
    *) echo "fedavg feddyn fedprox ivon-admm fedlap fedlap-cov fedlap-func ivon-pvi" ;;
  esac
}

for seed in $SEEDS; do
  for scenario in $SCENARIOS; do
    for method in ${4:-$(methods_for "$scenario")}; do
      dir="$RUNS/$scenario/$method-s$seed"
      if [ -f "$dir/status.json" ] && grep -q '"completed"' "$dir/status.json"; then
        continue
      fi
      echo "=== $(date -u +%H:%M:%S) $scenario $method seed $seed -> $dir"
      if [ -f "$dir/checkpoint.pt" ]; then
        "$BIN" resume "$dir" --quiet
      else
        # shellcheck disable=SC2086
        "$BIN" run "$scenario" method="$method" seed="$seed" out="$dir" ${EXTRA:-} --quiet
      fi
      echo "=== exit $? after $SECONDS s"
    done
  done
done
