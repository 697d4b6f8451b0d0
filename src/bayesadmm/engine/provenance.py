"""Where a run's numbers were computed: code version, library versions and processor, kept beside the run.

The same command gives bitwise the same numbers on one machine (resume, any number of workers), but not across
processors: torch's CPU kernels round differently on different instruction sets and a network amplifies the
difference within a round (docs/results/README.md measured it). So each start and each resume of a run appends one
record to the run's environment.json; reading a stored run, one can tell which code and which processor made it.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import torch

import bayesadmm
from bayesadmm.engine.rundir import read_bytes, write_json


def _git_commit(path: Path) -> str | None:
    """The commit of the checkout the package is imported from (with '+dirty' for uncommitted changes), or None
    when it is installed from a wheel or git is missing."""
    try:
        head = subprocess.run(["git", "-C", str(path), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10)
        if head.returncode != 0:
            return None
        dirty = subprocess.run(
            ["git", "-C", str(path), "status", "--porcelain", "--untracked-files=no", "--", "."],
            capture_output=True,
            text=True,
            timeout=10,
        )
        return head.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return None


# the instruction sets that decide which kernels (and so which rounding) torch's CPU code uses
_VECTOR_FLAGS = ("avx", "avx2", "fma", "avx512f", "avx512_bf16", "avx512_vnni", "amx_tile")


def _processor() -> tuple[str, list[str]]:
    """The CPU's model name and vector instruction sets (platform.processor() is often empty on Linux;
    /proc/cpuinfo says both)."""
    name, flags = "", set[str]()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name") and not name:
                name = line.split(":", 1)[1].strip()
            elif line.startswith("flags") and not flags:
                flags = set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return name or platform.processor() or platform.machine(), [f for f in _VECTOR_FLAGS if f in flags]


def environment(device: str, from_round: int) -> dict:
    """One record: when, from which round, and on what the run is (re)started."""
    package_dir = Path(bayesadmm.__file__).resolve().parent
    processor, vector_flags = _processor()
    record = {
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "from_round": from_round,
        "bayesadmm": bayesadmm.__version__,
        "git_commit": _git_commit(package_dir),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "processor": processor,
        "cpu_vector_flags": vector_flags,
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "cpu_count": os.cpu_count(),
        "device": device,
    }
    if device.startswith("cuda") and torch.cuda.is_available():
        record["cuda_device"] = torch.cuda.get_device_name(torch.device(device))
    return record


def record_environment(run_dir: Path, device: str, from_round: int, layout: dict | None = None) -> None:
    """Append this start's record to run_dir/environment.json (a list; a resume adds one), with `layout` (how the
    clients are trained: workers, cohort size). Never fails the run."""
    path = run_dir / "environment.json"
    try:
        records = json.loads(read_bytes(path)) if os.path.lexists(path) else []  # never through a link
        if not isinstance(records, list):
            records = []
        records.append(environment(device, from_round) | (layout or {}))
        write_json(path, records)
    except (
        OSError,
        ValueError,
    ) as exc:  # RunDirError is a ValueError  # provenance is worth a warning, never a lost run
        print(f"warning: could not write {path}: {exc}", file=sys.stderr)
