#!/usr/bin/env bash
# The GPU checks of cohort training, the CIFAR models and the peers, prepared for one call of a lent GPU machine
# (the `device` tool) of at most 10 minutes (each step stops at its own time limit; on an H100 it took 7½):
#
#     bash scripts/device_check.sh            # in the repository root, on a machine with CUDA
#
# It needs python3 with a CUDA build of torch, numpy, matplotlib, tqdm, pytest and scikit-learn (the device image has
# them) and puts src/ on the path. Flower with Ray and ivon-opt, which that image lacks, are taken from
# $CARRY/site.tar.xz if it is there (a site-packages folder for its Python, made by scripts/device_carry.sh);
# without them the Flower contender is left out. FashionMNIST is read where it is installed; elsewhere its
# images are made random (seeded) beside its real label files from $CARRY/fashion-mnist if they are there, so that a
# scenario's partition is the real one and every shape and step is as with the real images; no timing changes.
# Each step runs under its own time limit and logs to $OUT (or /tmp/device-check):
#   1. tests/engine/test_cohort.py on CUDA: cohort = per-client results for every method that batches (1e-10 in
#      float64, rounding in float32), and a GPU cohort round = the CPU's per-client numbers in float64;
#   2. benchmarks/peers/compare.py --device cuda on fmnist-heterog100 (FedAvg, IVON-ADMM): bayesadmm's GPU cohorts, the
#      plain PyTorch loop on the GPU and the Flower simulation with num_gpus 0.25 per ClientApp, one local epoch;
#   3. benchmarks/cifar_models.py --device cuda: one round of FedAvg and IVON-ADMM with the papers' CIFAR models on
#      10 clients of CIFAR-shaped random data, per-client against one cohort, seconds and peak GPU memory;
#   4. benchmarks/cohort.py --device cuda for FedAvg at 10, 100 and 1000 clients and IVON-ADMM at 10 and 100;
#   5. bayesadmm.run(..., device="cuda") on scikit-learn's digits for FedAvg, FedDyn and IVON-ADMM, cohort=0 (the
#      automatic GPU cohorts) against cohort=1, and against the CPU: accuracy and seconds per round.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-/tmp/device-check}
dev=${DEVICE:-cuda}  # DEVICE=cpu: a dry run of the plumbing on a machine without a GPU
carry=${CARRY:-.carry}
mkdir -p "$out"
export PYTHONPATH=src PYTHONUNBUFFERED=1
status=0
began=$SECONDS
step() {  # step NAME SECONDS LOG COMMAND...: run COMMAND under a time limit, its output appended to LOG
  local name=$1 limit=$2 log=$3 rc
  shift 3
  echo "== $name (limit ${limit} s, at $((SECONDS - began)) s)" | tee -a "$log"
  local start=$(($(wc -l <"$log") + 1))
  timeout -k 5 "$limit" "$@" >>"$log" 2>&1
  rc=$?
  tail -n "+$start" "$log" | tail -n "${TAIL:-14}"
  [ $rc = 0 ] || { status=1; echo "!! $name: exit $rc" | tee -a "$log"; }
}

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>&1 | tee "$out/gpu.txt"
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available())" | tee -a "$out/gpu.txt"

site=""
if [ -f "$carry/site.tar.xz" ]; then
  site=/tmp/device-site
  mkdir -p "$site" && tar -C "$site" -xJf "$carry/site.tar.xz" && echo "carried packages unpacked into $site"
fi
if ! python3 -c "from bayesadmm.data import load_image_dataset as l; l('fashion-mnist', 'train', download=False)" \
  2>/dev/null; then
  export BAYESADMM_DATA=/tmp/device-data
  python3 - "$carry/fashion-mnist" <<'PY' | tee -a "$out/gpu.txt"
import gzip, shutil, sys
from pathlib import Path
import numpy as np

labels, root = Path(sys.argv[1]), Path("/tmp/device-data/fashion-mnist")
root.mkdir(parents=True, exist_ok=True)
rng = np.random.default_rng(0)
for split, n in (("train", 60000), ("t10k", 10000)):
    header = bytes([0, 0, 8, 3]) + b"".join(int(d).to_bytes(4, "big") for d in (n, 28, 28))
    (root / f"{split}-images-idx3-ubyte").write_bytes(header + rng.integers(0, 256, n * 784, dtype=np.uint8).tobytes())
    real = labels / f"{split}-labels-idx1-ubyte.gz"
    if real.exists():
        shutil.copy(real, root / real.name)
    else:
        header = bytes([0, 0, 8, 1]) + n.to_bytes(4, "big")
        (root / f"{split}-labels-idx1-ubyte").write_bytes(header + rng.integers(0, 10, n, dtype=np.uint8).tobytes())
kind = "FashionMNIST's real labels" if (labels / "train-labels-idx1-ubyte.gz").exists() else "random labels"
print(f"FashionMNIST absent: random images (seed 0) with {kind} in {root}")
PY
fi

TAIL=8 step "1. cohort tests on CUDA" 60 "$out/tests.log" \
  python3 -m pytest -q -p no:cacheprovider tests/engine/test_cohort.py -k cuda

peers_path=$PYTHONPATH
[ -n "$site" ] && peers_path="$site:$PYTHONPATH"
contenders="bayesadmm plain flower"
PYTHONPATH=$peers_path python3 -c "import flwr, ray" 2>/dev/null || {
  contenders="bayesadmm plain"
  echo "flwr or ray not importable: the Flower contender is left out" | tee -a "$out/peers.log"
}
for method in fedavg ivon-admm; do
  limit=80
  [ "$method" = fedavg ] || limit=130 # IVON-ADMM's kernels compile for the GPU in its first round
  PYTHONPATH=$peers_path step "2. peers on CUDA, $method" $limit "$out/peers.log" \
    python3 benchmarks/peers/compare.py --scenario fmnist-heterog100 --method "$method" --repeats 1 --epochs 1 \
    --device "$dev" --flower-gpus 0.25 --contenders $contenders
done

TAIL=9 step "3. CIFAR models on CUDA" 70 "$out/cifar.log" \
  python3 benchmarks/cifar_models.py --device "$dev" --clients 10 --examples 320 --epochs 1 --rounds 2

step "4. cohort.py on CUDA, fedavg" 50 "$out/cohort.log" \
  python3 benchmarks/cohort.py --device "$dev" --method fedavg --clients 10 100 1000 --cohort-size 64 --repeats 2
step "4. cohort.py on CUDA, ivon-admm" 60 "$out/cohort.log" \
  python3 benchmarks/cohort.py --device "$dev" --method ivon-admm --clients 10 100 --cohort-size 64 --repeats 2

# the CPU's IVON kernels compile here first (a minute on a fresh machine)
TAIL=12 step "5. bayesadmm.run on CUDA" 120 "$out/api.log" python3 - <<'PY'
import os, tempfile, torch
from sklearn.datasets import load_digits
from torch import nn
import bayesadmm

DEV = os.environ.get("DEVICE", "cuda")

X, y = load_digits(return_X_y=True)
X, y = torch.tensor(X / 16.0, dtype=torch.float32), torch.tensor(y)
clients = [(X[i:1500:10], y[i:1500:10]) for i in range(10)]
test = (X[1500:], y[1500:])
hparams = {"fedavg": {"lr": 1e-3, "epochs": 2}, "feddyn": {"lr": 1e-3, "epochs": 2, "alpha": 0.01},
           "ivon-admm": {"lr": 0.1, "epochs": 2, "rho": 1.0, "gamma": 1.0, "delta": 1.0, "hess_init": 1.0}}
print("| method | device | cohort | acc after 3 rounds | s/round (rounds 2-3) |\n|---|---|---|---|---|")
for method, hp in hparams.items():
    for device, cohort in (("cpu", 1), (DEV, 1), (DEV, 0)):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(64, 200), nn.Sigmoid(), nn.Linear(200, 10))
        folder = tempfile.mkdtemp(prefix=f"{method}-{device}-{cohort}-")
        result = bayesadmm.run(model, clients, test=test, algorithm=method, rounds=3, hparams=hp, device=device,
                               cohort=cohort, seed=0, progress=False, out=folder)
        seconds = sorted(line["seconds"] for line in result.history[1:])
        print(f"| {method} | {device} | {cohort} | {100 * result.history[-1]['test_acc']:.2f} % | "
              f"{seconds[len(seconds) // 2]:.3f} |", flush=True)
PY

echo "== done in $((SECONDS - began)) s, status $status"
exit $status
