"""Whether a run's IVON solves call the compiled kernels or the eager maths: the `compile` setting ("auto", "on",
"off") of `bayesadmm.run` and the command line, and the rule "auto" decides by.

The choice travels with the solver (`solvers.ivon.IVONSolver.compiled`), which calls the kernels of `kernels_for`
its choice: nothing process-wide is switched, so runs with different choices can share a process, and a worker
process, which builds the run's algorithm from the same settings, makes the same choice. `BAYESADMM_COMPILE=0` in
the environment still runs every kernel eagerly (`kernels.compile_enabled`): an override for the test suite and for
debugging, not the setting.

Compiled and eager kernels compute the same maths and agree to rounding, not bit for bit (optim/kernels.py), so
"auto" is a rule of the run's settings and model alone, never of timings taken at run time: the same run makes the
same choice on every machine, and a resume makes the choice its run made. The rule (`compile_pays`): compiling the
kernels a solve calls costs `COLD_COMPILE_S` seconds once per process on an empty Inductor cache, and saves
`STEP_SAVING_S` + `PARAMETER_SAVING_S` × d seconds at every local step of a model with d parameters (eager IVON
dispatches ~25 operations per step; the compiled kernel is one loop). Compiling pays where a run's local steps
times that saving exceed the compilation. The constants are what `python benchmarks/compile_rule.py` printed
(docs/performance.md): the README quickstart (771 parameters, 350 local steps) runs eagerly, IVON-ADMM on the
papers' FashionMNIST MLP (178,110 parameters, ~10⁵ local steps) compiled.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

from bayesadmm.optim import kernels

__all__ = [
    "MODES",
    "COLD_COMPILE_S",
    "STEP_SAVING_S",
    "PARAMETER_SAVING_S",
    "Kernels",
    "COMPILED",
    "EAGER",
    "kernels_for",
    "check_mode",
    "compile_pays",
    "decide",
    "compiled_here",
    "compiling_note",
]

MODES = ("auto", "on", "off")

# python benchmarks/compile_rule.py (docs/performance.md, "Compile or not"): the three kernels of a solve compiled
# on an empty cache, and the line through the seconds one step call saves compiled against eager
COLD_COMPILE_S = 15.0
STEP_SAVING_S = 202e-6
PARAMETER_SAVING_S = 18.3e-9


class Kernels(NamedTuple):
    """The fused kernels an IVON solve calls (`optim.kernels`), compiled (`COMPILED`) or eager (`EAGER`)."""

    sample_step: Callable
    sample_rows_step: Callable
    update_step_: Callable
    update_and_sample_step_: Callable


COMPILED = Kernels(kernels.sample_step, kernels.sample_rows_step, kernels.update_step_, kernels.update_and_sample_step_)
EAGER = Kernels(*(fn.eager for fn in COMPILED))  # type: ignore[attr-defined]   # the functions compiled


def kernels_for(compiled: bool) -> Kernels:
    """`COMPILED` (compiled on first use; eager where compiling fails or BAYESADMM_COMPILE=0) or `EAGER`."""
    return COMPILED if compiled else EAGER


def check_mode(mode: object) -> str | None:
    """What is wrong with a `compile` setting (None: nothing)."""
    if isinstance(mode, str) and mode in MODES:
        return None
    return f"compile must be one of {', '.join(MODES)} (auto: where it pays for the run), got {mode!r}"


def compile_pays(dim: int, steps: float) -> bool:
    """Whether `steps` local IVON steps of a model with `dim` parameters save more time compiled than compiling
    the kernels costs on an empty cache (the module docstring's rule)."""
    return steps * (STEP_SAVING_S + PARAMETER_SAVING_S * dim) > COLD_COMPILE_S


def decide(mode: str, dim: int, steps: float) -> bool:
    """The kernels' choice for a run in `mode`: "on" compiled, "off" eager, "auto" `compile_pays(dim, steps)`,
    with `steps` the local steps the run's clients take in all."""
    problem = check_mode(mode)
    if problem:
        raise ValueError(problem)
    return mode == "on" or (mode == "auto" and compile_pays(dim, steps))


def compiled_here() -> bool:
    """Whether this process has compiled IVON's kernels already (a later run in it does not wait for the compiler;
    worker processes compile their own)."""
    return any(fn.compiled_here() for fn in COMPILED)  # type: ignore[attr-defined]


def compiling_note(round_: int) -> str:
    """What a run's progress says before round `round_` when that round compiles the kernels first."""
    return (
        f"round {round_} compiles IVON's kernels first (torch.compile, once per process: about {COLD_COMPILE_S:.0f} s "
        "on an empty cache); compile=off runs them eagerly instead"
    )
