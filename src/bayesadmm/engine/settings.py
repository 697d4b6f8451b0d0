"""How a federation runs: `Settings`, the one place where a run's schedule and execution settings are validated.

Every entry point builds one `Settings` and hands it down: `bayesadmm.run`, the CLI's config layer
(`experiments.build.settings_of`, whose `RunConfig` delegates these keys' checks here: `problems`), sweeps and tuning
(through the CLI's configs) and Flower's run config (`flower.app_config`). A wrong value is a `ValueError` naming the
key, what it must be and the value given.

`dtype` is the precision the engine computes in ("float32", the default, or "float64"): the initial parameters and
the data are made or cast in it explicitly (`torch_dtype`), and nothing changes torch's process-wide default. (Not
"precision": that is a hyperparameter of the isotropic family's methods.)
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

import torch

from bayesadmm.optim.compilation import check_mode

__all__ = ["Settings", "DTYPES", "KEYS", "check_device", "problems", "dtype_name"]

# the engine's precisions: name → torch dtype
DTYPES: dict[str, torch.dtype] = {"float32": torch.float32, "float64": torch.float64}

# where client states live (`engine.store.STORES`; spelt here so that settings import nothing of the engine)
CLIENT_STORES = ("auto", "memory", "disk")

# integer keys: (smallest valid value, what the values mean, for the message)
_INTEGERS: dict[str, tuple[int, str]] = {
    "rounds": (1, "the communication rounds"),
    "seed": (0, "the seed every random stream derives from"),
    "eval_samples": (1, "posterior samples for the predictive's metrics"),
    "workers": (0, "0: one per core on the CPU, one on a GPU"),
    "checkpoint_every": (1, "write the checkpoint every N rounds and after the last"),
    "stop_at": (0, "0: run all rounds"),
    "cohort": (0, "0: automatic, 1: one client at a time"),
}


@dataclass(frozen=True)
class Settings:
    """How a federation runs.

    `workers`: client updates in that many processes (0: one per core on the CPU, one on a GPU), same numbers for any
    count. `cohort`: train a round's clients that many at a time as one batched computation where the method's local
    solver allows it (`engine.cohort`), the per-client numbers up to rounding; 1: one client at a time; 0:
    `automatic_cohort`'s size (on a CPU the clients spread over the cores, at most 16 for Adam and 1 for IVON, where
    batching is no faster; each worker's clients on a GPU).
    `stop_at`: stop after that round with the schedule of `rounds` (0: run all). `checkpoint_every`: write the
    checkpoint every N rounds (and after the last). `dtype`: "float32" or "float64", the precision of the server's
    state and the evaluation (`torch_dtype`). `compile`: "auto" (default), "on" or "off": whether the local solvers
    call compiled kernels (IVON's; the numbers equal to rounding, not bit for bit), "auto" where the run's local
    steps win back the compilation (`optim.compilation.decide`, a rule of the run's settings and model only).
    `client_store`: where the client states live, "memory", "disk" (block files in the run directory with a bounded
    cache: `engine.store`) or "auto" (on disk above `store.AUTO_DISK_CLIENTS` clients); the same bits in either."""

    rounds: int = 10
    seed: int = 0
    participation: float = 1.0
    eval_samples: int = 32
    device: str = "cpu"
    workers: int = 1
    checkpoint_every: int = 1
    stop_at: int = 0
    cohort: int = 0
    dtype: str = "float32"
    compile: str = "auto"
    client_store: str = "auto"

    def __post_init__(self) -> None:
        found = problems({f.name: getattr(self, f.name) for f in fields(self)})
        if found:
            raise ValueError("; ".join(found))

    @property
    def last_round(self) -> int:
        return min(self.stop_at, self.rounds) if self.stop_at else self.rounds

    @property
    def torch_dtype(self) -> torch.dtype:
        """The torch dtype `dtype` names."""
        return DTYPES[self.dtype]


KEYS = tuple(f.name for f in fields(Settings))


def problems(values: Mapping[str, Any], check_machine: bool = True) -> list[str]:
    """What is wrong with the settings among `values` (any subset of `KEYS`; other keys are ignored), one message a
    key naming it, what it must be and the value given. `check_machine=False` skips whether this machine has the
    device (a saved configuration's device is checked where it runs)."""
    found = []
    for key, (low, meaning) in _INTEGERS.items():
        if key in values:
            value = values[key]
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                found.append(f"{key} must be an integer >= {low} ({meaning}), got {value!r}")
    if "participation" in values:
        value = values["participation"]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 1:
            found.append(f"participation must be in (0, 1] (the fraction of clients per round), got {value!r}")
    if "compile" in values and check_mode(values["compile"]):
        found.append(str(check_mode(values["compile"])))
    if "client_store" in values and values["client_store"] not in CLIENT_STORES:
        found.append(f"client_store must be one of {', '.join(CLIENT_STORES)}, got {values['client_store']!r}")
    if "dtype" in values and values["dtype"] not in DTYPES:
        found.append(f"dtype must be one of {', '.join(DTYPES)}, got {values['dtype']!r}")
    if "device" in values:
        device = values["device"]
        problem = check_device(device) if check_machine else _parse_device(device)
        if problem:
            found.append(problem)
    rounds, stop_at = values.get("rounds"), values.get("stop_at")
    if not found and isinstance(rounds, int) and isinstance(stop_at, int) and stop_at > rounds:
        found.append(f"stop_at must be in [0, rounds={rounds}] (0: run all rounds), got {stop_at}")
    return found


def dtype_name(dtype: torch.dtype) -> str:
    """The name of a floating dtype (`DTYPES`); a ValueError naming the fix for one the engine does not compute in."""
    for name, known in DTYPES.items():
        if known == dtype:
            return name
    raise ValueError(f"unsupported dtype {dtype}; the engine computes in float32 or float64 (cast the model)")


def _parse_device(device: Any) -> str | None:
    try:
        torch.device(device)
    except (RuntimeError, TypeError):
        return f"device must be a torch device such as cpu, cuda or cuda:1, got {device!r}"
    return None


def check_device(device: str) -> str | None:
    """What is wrong with `device` on this machine (None: nothing): not a torch device, or one torch cannot use here."""
    problem = _parse_device(device)
    if problem:
        return problem
    parsed = torch.device(device)
    if parsed.type == "cuda":
        if not torch.cuda.is_available():
            return (
                f"device={device} but torch {torch.__version__} sees no CUDA device on this machine "
                f"(torch.cuda.is_available() is False)"
            )
        if parsed.index is not None and parsed.index >= torch.cuda.device_count():
            return f"device={device} but this machine has {torch.cuda.device_count()} CUDA device(s)"
    elif parsed.type == "mps" and not torch.backends.mps.is_available():
        return f"device={device} but torch sees no MPS device on this machine"
    elif parsed.type not in ("cpu", "cuda", "mps"):
        return f"device={device}: only cpu, cuda and mps are supported"
    return None
