"""Tune the presets a method lacks on a shipped scenario, on its validation split, and write them into the scenario.

    python scripts/tune_presets.py fmnist-heterog100 [--methods fedlap fedep ...] [--trials 8] \
        [--set stop_at=15 ...] [--space NAME=SPEC ...] [--out runs/presets] [--write [FILE.json]]

For each registered method without a preset for SCENARIO (or each one named), `bayesadmm tune` (`experiments.tune`)
centred on the method's preset for the nearest scenario that has one (`DONORS`: a FashionMNIST scenario takes
fmnist-heterog10's) and on `--set`'s values, which also go to every trial (`--set stop_at=15` scores each trial
after the first 15 rounds of the scenario's schedule, as the baselines of fmnist-heterog10 were tuned). A method with no donor preset needs its values in
`--set`, and one with no declared search space (AMA, BayesADMM-iso) its `--space`; without them its tune is refused,
naming what is missing, and the next method goes on. Each tune's folder
(OUT/SCENARIO/METHOD) keeps its study, so the same command goes on after a kill. It prints one line per method: the
chosen values and their validation score against the centre's (the first trial).

With `--write` the chosen values (3 significant figures) become the method's preset in the scenario's JSON
(src/bayesadmm/experiments/scenarios/SCENARIO.json, or the FILE.json given), with the tune's command, trial budget
and scores as its source; a method that already has a preset there is left alone.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from pathlib import Path

import optuna

from bayesadmm.algorithms import spec as method_specs
from bayesadmm.experiments.config import ConfigError, resolve
from bayesadmm.experiments.methods import method_parameters
from bayesadmm.experiments.scenario_data import presets_of
from bayesadmm.experiments.tune import Tuning, space_for

SCENARIOS = Path(__file__).resolve().parents[1] / "src/bayesadmm/experiments/scenarios"
DONORS = {  # where a scenario's missing preset is centred: the nearest scenario with the same data and model
    "fmnist-homog10": "fmnist-heterog10",
    "fmnist-heterog100": "fmnist-heterog10",
    "fmnist-xdevice": "fmnist-heterog10",
    "mnist-heterog10": "mnist-homog10",
    "mnist-homog10": "mnist-heterog10",
    "mnist-heterog100": "mnist-heterog10",
}


def missing(scenario: str) -> list[str]:
    """The registered methods without a preset for `scenario`."""
    return [name for name in method_specs.names() if scenario not in presets_of(method_specs.get(name))]


def centre(method: str, scenario: str, given: list[str]) -> list[str]:
    """The method's hyperparameters as KEY=VALUE: its preset on the donor scenario, then `given`."""
    donor = presets_of(method_specs.get(method)).get(DONORS.get(scenario, ""), {})
    keys = {item.partition("=")[0] for item in given}
    return [f"{key}={_text(value)}" for key, value in donor.items() if key not in keys] + list(given)


def _text(value) -> str:
    """A preset's value as the command line writes it (true, 0.001, participants)."""
    return value if isinstance(value, str) else json.dumps(value)


def _value(text: str):
    """A KEY=VALUE's value as a preset holds it."""
    try:
        return json.loads(text)
    except ValueError:
        return text


def rounded(value):
    """A chosen value to 3 significant figures (ints and choices as they are)."""
    return float(f"{value:.3g}") if isinstance(value, float) else value


def tune(method: str, args) -> dict | None:
    """Run (or go on with) the method's tune; its chosen values, scores and command, or None where it is refused."""
    fixed = [f"method={method}", *centre(method, args.scenario, args.set)]
    out = args.out / args.scenario / method
    try:
        tuning = Tuning(args.scenario, tuple(fixed), space_for(method, args.space), out, args.trials)
        study = tuning.run()
    except (ConfigError, ValueError) as exc:
        print(f"{method}: refused: {exc}", flush=True)
        return None
    best, first = study.best_trial, study.trials[0]
    spaces = "".join(f" --space {shlex.quote(item)}" for item in args.space)
    command = f"bayesadmm tune {args.scenario} {shlex.join(fixed)}{spaces} --trials {args.trials} --out {out}"
    return {
        "chosen": {name: rounded(value) for name, value in best.params.items()},
        "fixed": fixed,
        "metric": tuning.objective,
        "best": best.value,
        "first": first.value if first.number != best.number else None,
        "trials": sum(trial.value is not None for trial in study.trials),
        "command": command,
    }


def preset_of(method: str, found: dict) -> dict:
    """The method's preset: its hyperparameters among the fixed values, the chosen ones in their place."""
    parameters = method_parameters(method)
    preset = {}
    for item in found["fixed"][1:]:
        key, _, text = item.partition("=")
        if key in parameters:
            preset[key] = _value(text)
    return {**preset, **found["chosen"]}


def write(path: Path, scenario: str, method: str, found: dict) -> None:
    """The method's preset inserted into the scenario's JSON `path`, in its methods' alphabetical place, as the file
    lays them out (one line for the preset, one for the source)."""
    text = path.read_text()
    data = json.loads(text)
    if method in data["methods"]:
        return
    preset = preset_of(method, found)
    first = "" if found["first"] is None else f", the centre's (first trial) {found['first']:.4g}"
    donor = DONORS.get(scenario, "")
    centred = f"{donor}'s preset" if donor in presets_of(method_specs.get(method)) else "the values given"
    source = (
        f"tuned on the validation split: `{found['command']}` ({found['trials']} trial"
        f"{'s' if found['trials'] != 1 else ''}; {found['metric']} {found['best']:.4g}{first}), centred on {centred}"
    )
    entry = (
        f'    {json.dumps(method)}: {{\n      "preset": {json.dumps(preset)},\n      "source": {json.dumps(source)}\n'
        "    },\n"
    )
    later = [name for name in data["methods"] if name > method]
    anchor = f"    {json.dumps(later[0])}: {{\n" if later else None
    if anchor is not None and anchor in text:
        text = text.replace(anchor, entry + anchor, 1)
    else:  # the last method: after the methods block's last entry
        last = f"    {json.dumps(list(data['methods'])[-1])}: {{"
        start = text.index(last)
        end = text.index("\n    }", start) + len("\n    }")
        text = text[:end] + ",\n" + entry.rstrip(",\n") + text[end:]
    assert json.loads(text)["methods"][method]["preset"] == preset  # the file still parses, with the preset in it
    path.write_text(text)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("scenario")
    parser.add_argument("--methods", nargs="+", help="these methods (default: every one without a preset here)")
    parser.add_argument("--trials", type=int, default=8, help="finished trials per method (default 8)")
    parser.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="settings of every trial")
    parser.add_argument("--out", type=Path, default=Path("runs/presets"))
    parser.add_argument("--space", action="append", default=[], metavar="NAME=SPEC", help="as bayesadmm tune's")
    parser.add_argument(
        "--write",
        nargs="?",
        const="",
        metavar="FILE.json",
        help="write the chosen presets into the scenario's JSON (or this copy of it)",
    )
    args = parser.parse_args()
    try:
        resolve(args.scenario, ["method=fedavg"])
    except ConfigError as exc:
        sys.exit(f"tune_presets: {exc}")
    optuna.logging.set_verbosity(optuna.logging.WARNING)  # one line per method is printed here
    for method in args.methods or missing(args.scenario):
        found = tune(method, args)
        if found is None:
            continue
        first = "" if found["first"] is None else f" (the centre, first trial: {found['first']:.4f})"
        print(f"{method}: {found['metric']} {found['best']:.4f}{first} with {found['chosen']}", flush=True)
        if args.write is not None:
            write(Path(args.write) if args.write else SCENARIOS / f"{args.scenario}.json", args.scenario, method, found)


if __name__ == "__main__":
    main()
