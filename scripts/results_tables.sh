#!/usr/bin/env bash
# Rebuild every table and plot of docs/results from the runs, then refresh the tables docs/results/README.md quotes:
#
#   scripts/results_tables.sh [RUNS_DIR] [LR_RUNS_DIR]
#
# 1. scripts/collect_results.sh RUNS_DIR docs/results (published settings; default runs/fmnist) and LR_RUNS_DIR
#    docs/results/chosen-lr (IVON-ADMM with the lr chosen on the validation split; default runs/fmnist-lr), each only
#    if the folder exists: without them the tables are rebuilt from the run files already in docs/results;
# 2. per 10-client scenario, the chosen-lr IVON-ADMM runs against every completed baseline run (compare --paper),
#    written to docs/results/<scenario>-chosen-lr;
# 3. scripts/embed_tables.py docs/results/README.md.
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${1:-runs/fmnist}
LR_RUNS=${2:-runs/fmnist-lr}
BIN=${BAYESADMM:-.venv/bin/bayesadmm}
PY=${PYTHON:-.venv/bin/python}
if [ -d "$RUNS" ]; then scripts/collect_results.sh "$RUNS" docs/results; fi
if [ -d "$LR_RUNS" ]; then scripts/collect_results.sh "$LR_RUNS" docs/results/chosen-lr; fi
completed() { grep -q '"completed"' "$1/status.json" 2>/dev/null; }
for scenario in fmnist-heterog10 fmnist-homog10; do
  runs=()
  for method in fedavg fedprox feddyn fedlap fedlap-cov fedlap-func; do
    for run in docs/results/runs/$scenario/$method-s*; do
      if completed "$run"; then runs+=("$run"); fi
    done
  done
  for run in docs/results/chosen-lr/runs/$scenario/ivon-admm-s*; do
    if completed "$run"; then runs+=("$run"); fi
  done
  "$BIN" compare "${runs[@]}" --rounds 10,25,50 --paper "$scenario" --out "docs/results/$scenario-chosen-lr" > /dev/null
done
"$PY" scripts/embed_tables.py docs/results/README.md
