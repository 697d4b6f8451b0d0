#!/usr/bin/env bash
# Choose IVON-ADMM's learning rate on a validation split (never on the test set), as docs/results describes:
#
#   scripts/select_ivon_lr.sh SCENARIO [LRS] [ROUNDS] [RUNS_DIR]
#
# For each lr (default "5e-5 1.6e-4 5e-4"), the scenario's IVON-ADMM run with 10 % of its training set held out
# (validation=0.1) for the first ROUNDS (default 10) of its full schedule (stop_at: the cosine decay still spans all
# rounds), then the validation table of each. Runs already finished are reused. Extra settings: $EXTRA.
set -uo pipefail
cd "$(dirname "$0")/.."
SCENARIO=${1:?usage: scripts/select_ivon_lr.sh SCENARIO [LRS] [ROUNDS] [RUNS_DIR]}
LRS=${2:-"5e-5 1.6e-4 5e-4"}
ROUNDS=${3:-10}
RUNS=${4:-runs/select-lr}
BIN=${BAYESADMM:-.venv/bin/bayesadmm}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
for lr in $LRS; do
  dir="$RUNS/$SCENARIO/ivon-admm-lr$lr"
  if ! { [ -f "$dir/status.json" ] && grep -q '"stopped"\|"completed"' "$dir/status.json"; }; then
    # shellcheck disable=SC2086
    "$BIN" run "$SCENARIO" method=ivon-admm lr="$lr" validation=0.1 stop_at="$ROUNDS" out="$dir" ${EXTRA:-} --quiet
  fi
done
for lr in $LRS; do
  echo "lr = $lr (validation split; mean of the last 3 rounds)"
  "$BIN" compare "$RUNS/$SCENARIO/ivon-admm-lr$lr" --rounds "5,$ROUNDS" | grep -v "^wrote"
done
