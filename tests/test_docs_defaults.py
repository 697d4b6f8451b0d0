"""The defaults the documentation states, read from the pages and checked against the factories and signatures that
define them (the one source of each default), so a page cannot drift from the code unnoticed."""

import ast
import inspect
import re
from dataclasses import fields
from pathlib import Path

import pytest

import bayesadmm
from bayesadmm.algorithms import get
from bayesadmm.solvers.ivon import IVONSolver

DOCS = Path(__file__).resolve().parents[1] / "docs"


def _says(page: str, pattern: str) -> str:
    """The one group of `pattern` in docs/`page`, its lines joined by single spaces (sentences wrap)."""
    text = " ".join((DOCS / page).read_text().split())
    match = re.search(pattern, text)
    assert match, f"docs/{page} no longer says {pattern!r}: update the page or this test"
    return match.group(1)


def _default(method: str, key: str):
    """The default of a method's hyperparameter: its spec's `hparams` field (the one place it is set)."""
    return {f.name: f.default for f in get(method).fields()}[key]


@pytest.mark.parametrize("method", ["fedep", "fedsep", "fedpa"])
def test_architecture_states_the_ngvi_defaults(method):
    stated = int(_says("architecture.md", r"the methods' NGVI defaults are T = N = (\d+)"))
    assert _default(method, "ngvi_epochs") == stated
    assert _default(method, "ngvi_samples") == stated


@pytest.mark.parametrize("method", ["ivon-admm", "ivon-pvi"])
def test_choosing_a_method_states_the_ivon_defaults(method):
    restart = _says("guides/choosing-a-method.md", r"\(`(True|False)`, the factory's default\)")
    assert _default(method, "restart_at_q_g") is (restart == "True")
    tau = _says("guides/choosing-a-method.md", r"`tau` at its default (\d+(?:\.\d+)?)")
    assert _default(method, "tau") == float(tau)


def test_architecture_states_the_ivon_solver_round_start():
    stated = _says("architecture.md", r"The solver's default, `(\w+)\(\)`")
    start = {f.name: f for f in fields(IVONSolver)}["start"]
    assert start.default_factory.__name__ == stated


def _run_table() -> dict[str, str]:
    """`bayesadmm.run`'s arguments and defaults as the table of guides/own-model.md gives them."""
    lines = (DOCS / "guides" / "own-model.md").read_text().splitlines()
    start = lines.index("| argument | default | meaning |") + 2
    rows = {}
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        name, default = (cell.strip().strip("`") for cell in line.strip("|").split("|")[:2])
        rows[name] = default
    return rows


RUN_TABLE = _run_table()


@pytest.mark.parametrize("name", sorted(RUN_TABLE))
def test_the_run_table_states_bayesadmm_run_defaults(name):
    parameter = inspect.signature(bayesadmm.run).parameters[name]
    try:
        stated = ast.literal_eval(RUN_TABLE[name])
    except (ValueError, SyntaxError):
        # a description of what the default does (`out`: a dated folder), not a value
        assert parameter.default is None, f"{name}: the table describes {RUN_TABLE[name]!r}"
        return
    assert parameter.default == stated and type(parameter.default) is type(stated)
