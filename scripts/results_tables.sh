#!/usr/bin/env bash
# Rebuild every table and plot of docs/results from the runs, then refresh the tables docs/results/README.md quotes:
#
#   scripts/results_tables.sh [RUNS_DIR] [LR_RUNS_DIR] [H0_RUNS_DIR] [FUNC_RUNS_DIR]
#
# 1. scripts/collect_results.sh RUNS_DIR docs/results (the presets' settings; default runs/fmnist) and, for each
#    IVON-ADMM variant, its runs folder into docs/results/<variant>: `h0-every-round` (Alg. 2 as written, h <- h0 at
#    every round, `restart_at_q_g=false`; default runs/fmnist-h0) and `chosen-lr` (that, with the lr chosen on the
#    validation split; default runs/fmnist-lr); each only if the folder exists: without them the tables are rebuilt
#    from the run files already in docs/results;
# 2. per scenario and variant (where the variant has runs), the variant's IVON-ADMM (and IVON-PVI) runs against every completed
#    baseline run (compare --paper), written to docs/results/<scenario>-<variant>;
# 3. FedLap-Func with δ and τ_f chosen on the validation split (default runs/fmnist-func, collected into
#    docs/results/fedlap-func-chosen): per scenario, its runs beside the presets' FedLap-Func runs (δ = 0.01,
#    τ_f = 1e-4) and FedLap, written to docs/results/<scenario>-fedlap-func-chosen (compare names the rows by their
#    differing δ, τ_f);
# 4. scripts/embed_tables.py docs/results/README.md.
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${1:-runs/fmnist}
declare -A VARIANT_RUNS=([chosen-lr]=${2:-runs/fmnist-lr} [h0-every-round]=${3:-runs/fmnist-h0})
BIN=${BAYESADMM:-.venv/bin/bayesadmm}
PY=${PYTHON:-.venv/bin/python}
if [ -d "$RUNS" ]; then scripts/collect_results.sh "$RUNS" docs/results; fi
completed() { grep -q '"completed"' "$1/status.json" 2>/dev/null; }
for variant in h0-every-round chosen-lr; do
  if [ -d "${VARIANT_RUNS[$variant]}" ]; then
    scripts/collect_results.sh "${VARIANT_RUNS[$variant]}" "docs/results/$variant"
  fi
  for scenario in fmnist-heterog10 fmnist-homog10 fmnist-heterog100; do
    runs=()
    for method in fedavg fedprox feddyn fedlap fedlap-cov fedlap-func; do
      for run in docs/results/runs/$scenario/$method-s*; do
        if completed "$run"; then runs+=("$run"); fi
      done
    done
    variant_runs=()
    for run in docs/results/$variant/runs/$scenario/ivon-admm-s* docs/results/$variant/runs/$scenario/ivon-pvi-s*; do
      if completed "$run"; then variant_runs+=("$run"); fi
    done
    if [ ${#variant_runs[@]} -gt 0 ]; then
      "$BIN" compare "${runs[@]}" "${variant_runs[@]}" --rounds 10,25,50 --paper "$scenario" \
        --out "docs/results/$scenario-$variant" > /dev/null
    fi
  done
done
FUNC_RUNS=${4:-runs/fmnist-func}
if [ -d "$FUNC_RUNS" ]; then scripts/collect_results.sh "$FUNC_RUNS" docs/results/fedlap-func-chosen; fi
for scenario in fmnist-heterog10 fmnist-homog10; do
  chosen=()
  for run in docs/results/fedlap-func-chosen/runs/$scenario/fedlap-func-s*; do
    if completed "$run"; then chosen+=("$run"); fi
  done
  if [ ${#chosen[@]} -gt 0 ]; then
    runs=()
    for run in docs/results/runs/$scenario/fedlap-func-s* docs/results/runs/$scenario/fedlap-s*; do
      if completed "$run"; then runs+=("$run"); fi
    done
    "$BIN" compare "${runs[@]}" "${chosen[@]}" --rounds 10,25,50 --paper "$scenario" \
      --out "docs/results/$scenario-fedlap-func-chosen" > /dev/null
  fi
done
"$PY" scripts/embed_tables.py docs/results/README.md
