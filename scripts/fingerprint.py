"""Fingerprints of every registry method and variant, to check that a change of the library's structure leaves its
numbers bit-identical.

    python scripts/fingerprint.py OUT.json            # writes the fingerprints
    python scripts/fingerprint.py OUT.json --check BEFORE.json   # and compares them with an earlier file

Each variant runs 2 rounds of `fmnist-heterog10` (2 local epochs instead of the preset's 10, to keep it short)
through the command line in its own run folder; its fingerprint is the sha256 of every metric that is not a time
(metrics.jsonl) and of every tensor in the final checkpoint (server and client states), read with
`torch.load(weights_only=True)` so that nothing here depends on the library's own readers. The paper's toy problems
(`bayesadmm paper onestep|logreg|outlier|fedep-toy`, the `run_rounds` paths) are rerun and their JSON compared with
the committed `docs/figures/*.json`.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]

# (label, method, extra KEY=VALUE overrides); each runs with rounds=2 and epochs=2
VARIANTS: list[tuple[str, str, list[str]]] = [
    ("fedavg", "fedavg", []),
    ("fedavg-weighted", "fedavg", ["weighted=true"]),
    ("fedavg-cohort1", "fedavg", ["cohort=1"]),
    ("fedavg-workers2", "fedavg", ["workers=2"]),
    ("fedavg-partial", "fedavg", ["participation=0.5"]),
    ("fedprox", "fedprox", []),
    ("fedprox-weighted", "fedprox", ["weighted=true"]),
    ("feddyn", "feddyn", []),
    ("admm", "admm", []),
    ("ama", "ama", ["rho=0.01", "delta=1.0", "lr=1e-3", "batch_size=32"]),  # the defaults: its preset is diabetes's
    ("fedlap", "fedlap", []),
    ("fedlap-rho0.5", "fedlap", ["rho=0.5"]),
    ("fedlap-cov", "fedlap-cov", []),
    ("fedlap-cov-mcfisher", "fedlap-cov", ["curvature=mc-fisher"]),
    ("fedlap-func", "fedlap-func", ["server_iterations=200"]),
    ("ivon-admm", "ivon-admm", []),
    ("ivon-admm-alg2", "ivon-admm", ["restart_at_q_g=false", "cosine=false"]),
    ("ivon-admm-cohort2", "ivon-admm", ["cohort=2"]),
    ("ivon-admm-partial", "ivon-admm", ["participation=0.5", "workers=2"]),
    ("ivon-pvi", "ivon-pvi", []),
    ("bayes-admm-iso", "bayes-admm-iso", ["rho=0.1", "delta=1.0", "precision=1e4", "lr=1e-3", "batch_size=32"]),
    ("fedep-identity", "fedep", ["inference=identity"]),
    ("fedep-laplace", "fedep", ["inference=laplace"]),
    ("fedep-mcmc", "fedep", ["inference=mcmc"]),
    ("fedep-ngvi", "fedep", ["inference=ngvi"]),
    ("fedsep", "fedsep", []),
    ("fedsep-laplace", "fedsep", ["inference=laplace"]),
    ("fedpa", "fedpa", []),
    ("fedpa-identity", "fedpa", ["inference=identity"]),
]
PAPER = ["onestep", "logreg", "outlier", "fedep-toy"]
TIMES = ("seconds", "time")  # metric names holding wall-clock times: not compared


def tensors_of(tree, path="") -> list[tuple[str, torch.Tensor]]:
    if isinstance(tree, torch.Tensor):
        return [(path, tree)]
    if isinstance(tree, dict):
        return [item for key in sorted(tree, key=str) for item in tensors_of(tree[key], f"{path}/{key}")]
    if isinstance(tree, (list, tuple)):
        return [item for i, value in enumerate(tree) for item in tensors_of(value, f"{path}/{i}")]
    return []


def digest_tensors(tensors: list[torch.Tensor]) -> str:
    h = hashlib.sha256()
    for t in tensors:
        h.update(str((t.dtype, tuple(t.shape))).encode())
        h.update(t.detach().contiguous().cpu().reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def fingerprint_run(folder: Path) -> dict:
    rows = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines() if line.strip()]
    metrics = [{k: v for k, v in row.items() if not any(word in k for word in TIMES)} for row in rows]
    files = sorted(p for p in folder.rglob("*.pt"))
    tensors = [t for p in files for _, t in tensors_of(torch.load(p, weights_only=True, map_location="cpu"))]
    return {
        "metrics": hashlib.sha256(json.dumps(metrics, sort_keys=True).encode()).hexdigest(),
        "state": digest_tensors(tensors),
        "tensors": len(tensors),
        "last": {k: v for k, v in metrics[-1].items() if k.startswith(("test_", "val_"))},
    }


def run_variant(method: str, extra: list[str], folder: Path) -> dict:
    command = [sys.executable, "-m", "bayesadmm", "run", "fmnist-heterog10", f"method={method}", "rounds=2"]
    command += ["epochs=2", "workers=1", f"out={folder}", *extra]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    if done.returncode != 0:
        return {"error": (done.stderr or done.stdout).strip().splitlines()[-1:]}
    return fingerprint_run(folder)


def run_paper(name: str, folder: Path) -> dict:
    command = [sys.executable, "-m", "bayesadmm", "paper", name, "--out", str(folder)]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    if done.returncode != 0:
        return {"error": (done.stderr or done.stdout).strip().splitlines()[-1:]}
    out = {}
    for produced in sorted(folder.glob("*.json")):
        committed = ROOT / "docs" / "figures" / produced.name
        same = committed.is_file() and json.loads(committed.read_text()) == json.loads(produced.read_text())
        out[produced.name] = {
            "sha256": hashlib.sha256(produced.read_bytes()).hexdigest(),
            "equals_committed": same,
        }
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--check", type=Path, help="an earlier fingerprint file to compare with")
    parser.add_argument("--only", nargs="*", help="labels of the variants (and paper names) to run")
    parser.add_argument("--no-paper", action="store_true")
    args = parser.parse_args()
    result: dict = {"runs": {}, "paper": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for label, method, extra in VARIANTS:
            if args.only and label not in args.only:
                continue
            start = time.perf_counter()
            result["runs"][label] = run_variant(method, extra, Path(tmp) / label)
            print(f"{label:22s} {time.perf_counter() - start:6.1f} s {result['runs'][label]}", flush=True)
        for name in [] if args.no_paper else PAPER:
            if args.only and name not in args.only:
                continue
            result["paper"][name] = run_paper(name, Path(tmp) / f"paper-{name}")
            print(f"paper {name}: {result['paper'][name]}", flush=True)
    args.out.write_text(json.dumps(result, indent=1, sort_keys=True) + "\n")
    if not args.check:
        return 0
    before = json.loads(args.check.read_text())
    differ = []
    for group in ("runs", "paper"):
        for label, value in result[group].items():
            old = before.get(group, {}).get(label)
            if old is None:
                continue
            keys = ("metrics", "state") if group == "runs" else None
            same = all(old.get(k) == value.get(k) for k in keys) if keys else old == value
            if not same or "error" in value:
                differ.append(f"{group}/{label}")
    print("bit-identical" if not differ else f"DIFFERENT: {', '.join(differ)}")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
