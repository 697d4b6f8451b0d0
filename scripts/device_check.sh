#!/usr/bin/env bash
# The GPU checks of cohort training, prepared for one call of a lent GPU machine (the `device` tool), in ~5 minutes:
#
#     bash scripts/device_check.sh            # in the repository root, on a machine with CUDA
#
# It needs python3 with a CUDA build of torch, numpy, matplotlib, tqdm, pytest and scikit-learn (the device image has
# them), puts src/ on the path and installs nothing. Each step's log goes to $OUT (or /tmp/device-check):
#   1. tests/engine/test_cohort.py on CUDA: cohort = per-client results for every method that batches (1e-10 in
#      float64, rounding in float32), and a GPU cohort round = the CPU's per-client numbers in float64;
#   2. bayesadmm.run(..., device="cuda") on scikit-learn's digits for FedAvg, FedDyn and IVON-ADMM, cohort=0 (the
#      automatic GPU cohorts) against cohort=1, and against the CPU: accuracy and seconds per round;
#   3. benchmarks/cohort.py --device cuda for FedAvg at 10, 100 and 1000 clients and IVON-ADMM at 10 and 100 (its
#      kernels compile on the GPU first; random images of FashionMNIST's shape where its files are absent, which
#      changes no timing).
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-/tmp/device-check}
mkdir -p "$out"
export PYTHONPATH=src PYTHONUNBUFFERED=1
status=0
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>&1 | tee "$out/gpu.txt"
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available())" | tee -a "$out/gpu.txt"

echo "== 1. cohort tests on CUDA"
python3 -m pytest -q -p no:cacheprovider tests/engine/test_cohort.py -k "cuda" 2>&1 | tee "$out/tests.log" | tail -15
[ "${PIPESTATUS[0]}" = 0 ] || status=1

echo "== 2. bayesadmm.run on CUDA"
python3 - <<'PY' 2>&1 | tee "$out/api.log"
import tempfile, torch
from sklearn.datasets import load_digits
from torch import nn
import bayesadmm

X, y = load_digits(return_X_y=True)
X, y = torch.tensor(X / 16.0, dtype=torch.float32), torch.tensor(y)
clients = [(X[i:1500:10], y[i:1500:10]) for i in range(10)]
test = (X[1500:], y[1500:])
hparams = {"fedavg": {"lr": 1e-3, "epochs": 2}, "feddyn": {"lr": 1e-3, "epochs": 2, "alpha": 0.01},
           "ivon-admm": {"lr": 0.1, "epochs": 2, "rho": 1.0, "gamma": 1.0, "delta": 1.0, "hess_init": 1.0}}
print("| method | device | cohort | acc after 5 rounds | s/round (rounds 2-5) |\n|---|---|---|---|---|")
for method, hp in hparams.items():
    for device, cohort in (("cpu", 1), ("cuda", 1), ("cuda", 0)):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(64, 200), nn.Sigmoid(), nn.Linear(200, 10))
        folder = tempfile.mkdtemp(prefix=f"{method}-{device}-{cohort}-")
        result = bayesadmm.run(model, clients, test=test, algorithm=method, rounds=5, hparams=hp, device=device,
                               cohort=cohort, seed=0, progress=False, out=folder)
        seconds = sorted(line["seconds"] for line in result.history[1:])
        print(f"| {method} | {device} | {cohort} | {100 * result.history[-1]['test_acc']:.2f} % | "
              f"{seconds[len(seconds) // 2]:.3f} |", flush=True)
PY
[ "${PIPESTATUS[0]}" = 0 ] || status=1

echo "== 3. benchmarks/cohort.py on CUDA"
python3 benchmarks/cohort.py --device cuda --method fedavg --clients 10 100 1000 --cohort-size 32 64 --repeats 3 \
  2>&1 | tee "$out/cohort-fedavg.log"
[ "${PIPESTATUS[0]}" = 0 ] || status=1
python3 benchmarks/cohort.py --device cuda --method ivon-admm --clients 10 100 --cohort-size 32 64 --repeats 3 \
  2>&1 | tee "$out/cohort-ivon-admm.log"
[ "${PIPESTATUS[0]}" = 0 ] || status=1
exit $status
