#!/usr/bin/env bash
# Copy the small files of reproduction runs into the repository and rebuild the comparison tables:
#
#   scripts/collect_results.sh RUNS_DIR DEST [ROUNDS]
#
# For every completed RUNS_DIR/<scenario>/<run>: config.json, metrics.jsonl, status.json (and environment.json) go to
# DEST/runs/<scenario>/<run> (checkpoints stay behind: they are large and only needed to resume; runs not completed
# are left out, named on stderr). Then, per scenario, `bayesadmm compare` over
# the runs that completed writes DEST/<scenario>/table.md, table.tex and curves.png (ROUNDS default 10,25,50), and
# for the FashionMNIST scenarios paper.md, our accuracy and NLL beside the papers' (`compare --paper`).
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${1:?usage: scripts/collect_results.sh RUNS_DIR DEST [ROUNDS]}
DEST=${2:?usage: scripts/collect_results.sh RUNS_DIR DEST [ROUNDS]}
ROUNDS=${3:-10,25,50}
BIN=${BAYESADMM:-.venv/bin/bayesadmm}
for scenario_dir in "$RUNS"/*/; do
  scenario=$(basename "$scenario_dir")
  completed=()
  for run in "$scenario_dir"*/; do
    name=$(basename "$run")
    [ -f "$run/config.json" ] || continue
    if ! grep -q '"completed"' "$run/status.json" 2>/dev/null; then
      echo "not completed, left out: $run" >&2      # its checkpoint (not copied) is what resumes it
      continue
    fi
    mkdir -p "$DEST/runs/$scenario/$name"
    cp "$run"/config.json "$run"/metrics.jsonl "$run"/status.json "$DEST/runs/$scenario/$name/"
    if [ -f "$run/environment.json" ]; then cp "$run/environment.json" "$DEST/runs/$scenario/$name/"; fi  # absent from older runs
    completed+=("$DEST/runs/$scenario/$name")
  done
  if [ ${#completed[@]} -gt 0 ]; then
    paper=()
    case "$scenario" in fmnist-heterog10|fmnist-homog10|fmnist-heterog100) paper=(--paper "$scenario") ;; esac
    "$BIN" compare "${completed[@]}" --rounds "$ROUNDS" --out "$DEST/$scenario" "${paper[@]}"
  fi
done
