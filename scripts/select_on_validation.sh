#!/usr/bin/env bash
# Choose one hyperparameter of a method on a validation split (never on the test set), as docs/results describes:
#
#   scripts/select_on_validation.sh SCENARIO METHOD KEY "VALUES" [ROUNDS] [RUNS_DIR]
#
# For each value, the scenario's METHOD run with KEY=value and 10 % of its training set held out (validation=0.1)
# for the first ROUNDS (default 10) of its full schedule (stop_at: schedules such as the cosine decay still span all
# rounds), then the validation table of each. Runs already finished are reused (RUNS_DIR/SCENARIO/METHOD-KEYvalue).
# Extra settings: $EXTRA. The rule used in docs/results: the best validation accuracy at round ROUNDS.
set -uo pipefail
cd "$(dirname "$0")/.."
USAGE='usage: scripts/select_on_validation.sh SCENARIO METHOD KEY "VALUES" [ROUNDS] [RUNS_DIR]'
SCENARIO=${1:?$USAGE}
METHOD=${2:?$USAGE}
KEY=${3:?$USAGE}
VALUES=${4:?$USAGE}
ROUNDS=${5:-10}
RUNS=${6:-runs/select}
BIN=${BAYESADMM:-.venv/bin/bayesadmm}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
for value in $VALUES; do
  dir="$RUNS/$SCENARIO/$METHOD-$KEY$value"
  if ! { [ -f "$dir/status.json" ] && grep -q '"stopped"\|"completed"' "$dir/status.json"; }; then
    if [ -f "$dir/checkpoint.pt" ]; then   # an interrupted run: go on from its checkpoint
      "$BIN" resume "$dir" --stop-at "$ROUNDS" --quiet
    else
      # shellcheck disable=SC2086
      "$BIN" run "$SCENARIO" method="$METHOD" "$KEY=$value" validation=0.1 stop_at="$ROUNDS" out="$dir" ${EXTRA:-} --quiet
    fi
  fi
done
for value in $VALUES; do
  echo "$KEY = $value (validation split; mean of the last 3 rounds)"
  "$BIN" compare "$RUNS/$SCENARIO/$METHOD-$KEY$value" --rounds "5,$ROUNDS" | grep -v "^wrote"
done
