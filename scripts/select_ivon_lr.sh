#!/usr/bin/env bash
# Choose IVON-ADMM's learning rate on a validation split (never on the test set), as docs/results describes:
#
#   scripts/select_ivon_lr.sh SCENARIO [LRS] [ROUNDS] [RUNS_DIR]
#
# scripts/select_on_validation.sh with METHOD=ivon-admm and KEY=lr (defaults: LRS "5e-5 1.6e-4 5e-4", 10 rounds,
# runs/select-lr; run folders RUNS_DIR/SCENARIO/ivon-admm-lr<value>).
set -uo pipefail
cd "$(dirname "$0")/.."
SCENARIO=${1:?usage: scripts/select_ivon_lr.sh SCENARIO [LRS] [ROUNDS] [RUNS_DIR]}
exec scripts/select_on_validation.sh "$SCENARIO" ivon-admm lr "${2:-5e-5 1.6e-4 5e-4}" "${3:-10}" "${4:-runs/select-lr}"
