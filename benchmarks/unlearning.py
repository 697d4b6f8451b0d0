"""Unlearning one client on a scenario: the unlearned posterior against the one retrained without the client.

    OMP_NUM_THREADS=1 nice -n 10 python benchmarks/unlearning.py [--methods ivon-admm fedlap-cov] [--client 3]
        [--scenario fmnist-heterog10] [--rounds 50] [--seed 0] [--runs runs/unlearning] [--out docs/results/unlearning]
        [--set KEY=VALUE ...]

For each method it trains the scenario (the method's preset) with every client and again with `exclude_client=J`,
resuming either run where its directory holds one (a finished run is read back as it is; `--train-only` trains the
runs and stops, so that methods can train in parallel processes), unlearns client J from the
first with `bayesadmm.unlearn`, and evaluates the three posteriors on the test set (at the mean and for the posterior
predictive) and on client J's own training data, with the KL divergences between them. It prints a Markdown table
and writes the numbers to OUT/<scenario>-c<J>-s<seed>.json. `--set` adds the scenario's settings to both runs (e.g.
`--set data_fraction=0.01 epochs=1` for a quick check that the script runs; tests/test_benchmarks.py runs it so).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

import torch

import bayesadmm
from bayesadmm.experiments.build import build, run
from bayesadmm.experiments.config import resolve

KEPT = "unlearned, the original kept where invalid (diagnostic)"
KL_NOTE = "KL(q‖q_retrained) and KL(q‖q_original): q_retrained is the run without the client"


def train(scenario: str, method: str, overrides: list[str], out: Path):
    """The run of `scenario` with `method` and `overrides`, resumed (or read back) from `out` where it exists."""
    config, _ = resolve(scenario, [f"method={method}", f"out={out}", *overrides])
    built = build(config)
    result = run(config, resume=(out / "checkpoint.pt").exists(), progress=False, built=built)
    if result.status != "completed":
        sys.exit(f"{out}: the run ended {result.status} ({result.message})")
    return result, built


def metrics(result, posterior, X, y, seed: int) -> dict[str, float]:
    """Accuracy and NLL at the mean and for the predictive (32 draws of a seeded generator)."""
    generator = torch.Generator().manual_seed(seed)
    values = bayesadmm.evaluate(result.model, posterior, X, y, samples=32, generator=generator)
    return {key: values[key] for key in ("acc", "nll", "ens_acc", "ens_nll") if key in values}


def kl(posterior, reference) -> float | None:
    """KL(posterior ‖ reference) in their shared family, or None where either is a point estimate."""
    if not (hasattr(posterior, "family") and hasattr(reference, "family")):
        return None
    return float(posterior.family.kl(posterior.natural, reference.natural))


def common(args) -> list[str]:
    """The overrides of both runs: the schedule, the seed, one process (the numbers do not depend on it) and `--set`."""
    return [f"rounds={args.rounds}", f"seed={args.seed}", "workers=1", *args.set]


def run_dir(args, method: str, without: bool) -> Path:
    return args.runs / f"{method}-{f'without{args.client}' if without else 'all'}-s{args.seed}"


def dual_share(result, client: int) -> dict[str, float] | None:
    """For diagonal BayesADMM (IVON-ADMM, IVON-PVI): the median over the weights of the duals' share Σ_k u_k / s_g of
    the server's precision, client `client`'s u_k / s_g (η_k = (v_k, −½u_k)) and the fraction of weights its removal
    leaves without a positive precision; None for other methods."""
    states = result.client_states()
    if not all(hasattr(state, "dual") and len(state.dual) == 2 for state in states.values()):
        return None
    precision = -2 * result.server.natural[1]
    duals = {k: -2 * state.dual[1] for k, state in states.items()}
    return {
        "all_clients": float((sum(duals.values()) / precision).median()),
        "client": float((duals[client] / precision).median()),
        # the weights where s_g − u_j ≤ 0: removing the client's dual leaves no valid Gaussian there (c = 1)
        "weights_left_invalid": float((precision - duals[client] <= 0).double().mean()),
    }


def kept_where_invalid(result, client: int):
    """A diagnostic, not the library's answer, for a diagonal BayesADMM run whose unlearning is refused: λ_g − η_j
    (c = 1) with the original λ_g kept on the weights where that leaves no positive precision; None for others."""
    state = result.client_states([client])[client]
    if not (hasattr(state, "dual") and len(state.dual) == 2):
        return None
    lam = tuple(a - b for a, b in zip(result.server.natural, state.dual, strict=True))
    invalid = lam[1] >= 0  # precision −2λ₂ ≤ 0
    lam = tuple(torch.where(invalid, old, new) for old, new in zip(result.server.natural, lam, strict=True))
    return dataclasses.replace(result, server=result.server._replace(natural=lam))


def compare(method: str, args) -> dict:
    """Train both runs of `method`, unlearn the client and evaluate the three posteriors."""
    full, built = train(args.scenario, method, common(args), run_dir(args, method, False))
    retrained, _ = train(
        args.scenario, method, [*common(args), f"exclude_client={args.client}"], run_dir(args, method, True)
    )
    row: dict = {"dual_share_of_precision": dual_share(full, args.client)}
    try:
        unlearned = bayesadmm.unlearn(full, args.client)
    except bayesadmm.UnlearningError as refusal:  # recorded as the method's answer
        unlearned, row["refused"] = None, str(refusal)
    kept = kept_where_invalid(full, args.client) if unlearned is None else None
    forgotten = built.federation.clients(args.client)
    X_test, y_test = built.federation.eval_X, built.federation.eval_y
    posteriors = (("original", full), ("unlearned", unlearned), (KEPT, kept), ("retrained", retrained))
    for name, result in posteriors:
        if result is None:
            continue
        row[name] = {
            "test": metrics(result, result.posterior, X_test, y_test, args.seed),
            "client": metrics(result, result.posterior, forgotten.X, forgotten.y, args.seed),
            "kl_to_retrained": kl(result.posterior, retrained.posterior),
            "kl_to_original": kl(result.posterior, full.posterior),
        }
    return row


def table(results: dict, args) -> str:
    """The Markdown table of `results` (method → posterior → numbers)."""
    lines = [
        f"| method | posterior | test acc | test NLL | predictive acc | predictive NLL | client {args.client} acc | "
        f"client {args.client} NLL | KL to retrained | KL to original |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for method, rows in results.items():
        if "refused" in rows:
            lines.append(f"| {method} | unlearned | refused: {rows['refused']} |" + " |" * 8)
        for name, row in rows.items():
            if name not in ("original", "unlearned", KEPT, "retrained"):
                continue
            test, client = row["test"], row["client"]
            ens = [f"{100 * test['ens_acc']:.2f}", f"{test['ens_nll']:.4f}"] if "ens_acc" in test else ["–", "–"]
            cells = [method, name, f"{100 * test['acc']:.2f}", f"{test['nll']:.4f}", *ens]
            cells += [f"{100 * client['acc']:.2f}", f"{client['nll']:.4f}"]
            cells += ["–" if row[key] is None else f"{row[key]:.4g}" for key in ("kl_to_retrained", "kl_to_original")]
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--methods", nargs="+", default=["ivon-admm", "fedlap-cov"])
    parser.add_argument("--scenario", default="fmnist-heterog10")
    parser.add_argument("--client", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=50)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--runs", type=Path, default=Path("runs/unlearning"))
    parser.add_argument("--out", type=Path, default=Path("docs/results/unlearning"))
    parser.add_argument("--train-only", action="store_true", help="train (or resume) the runs, compare nothing")
    parser.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="settings of both runs")
    args = parser.parse_args()
    if args.train_only:  # e.g. one process per method, then one without this flag to compare
        for method in args.methods:
            for extra in ([], [f"exclude_client={args.client}"]):
                train(args.scenario, method, [*common(args), *extra], run_dir(args, method, bool(extra)))
        return
    results = {method: compare(method, args) for method in args.methods}
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"{args.scenario}-c{args.client}-s{args.seed}.json"
    settings = {k: v for k, v in vars(args).items() if k not in ("runs", "out")}
    path.write_text(json.dumps({"settings": settings, "kl": KL_NOTE, "results": results}, indent=1) + "\n")
    print(table(results, args))
    print(f"\n{KL_NOTE}; numbers in {path}")


if __name__ == "__main__":
    main()
