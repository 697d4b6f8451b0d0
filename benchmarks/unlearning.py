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

With `--repair R R ...` (and `--seeds`) it measures unlearning against retraining with training after the removal:

    OMP_NUM_THREADS=1 python benchmarks/unlearning.py --repair 0 2 5 10 --seeds 0 1 2 \
        --methods ivon-admm ivon-admm:gamma=0.005 fedlap-cov fedep [--rounds 50]

for each method (METHOD or METHOD:KEY=VALUE,KEY=VALUE: a variant of its preset) and seed, (a) the run retrained
without client J (the reference), (b) the original run continued without J, its term kept where the method keeps
one, and (c) `bayesadmm.unlearn(..., out=DIR)` then `resume`, each R rounds after the original's last (both run
directories are written with rounds + max(R) rounds, so a schedule over the rounds spans them all); where the method
refuses (c) because the removal leaves some weights without a positive precision, (c) again with
`keep_invalid=True` (those weights keep the original's value until the repair rounds move them). At each R it
scores test accuracy and NLL at the posterior mean (and the 32-draw predictive), client J's training NLL, and a
loss-threshold membership inference: the AUC of separating J's training examples from unseen test examples of the same
classes (as many per class) by their NLL at the mean (0.5: indistinguishable). Every point is kept in
OUT/<scenario>-c<J>-repair.json as it is measured, so a second call goes on where one stopped; the table is the mean
± std over the seeds (`--table-only`: the table of the points saved, nothing trained). A seed whose training run does
not complete (it diverged) is recorded with its status and shown in a row of its own, and not trained again.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
from pathlib import Path

import torch

import bayesadmm
from bayesadmm.experiments.build import build, run
from bayesadmm.experiments.config import load, resolve
from bayesadmm.posterior.unlearned_run import write_run

KEPT = "unlearned with keep_invalid=True"
KL_NOTE = "KL(q‖q_retrained) and KL(q‖q_original): q_retrained is the run without the client"


class Ended(Exception):
    """A run that did not complete (it diverged or failed), with what its status says."""


def train(scenario: str, method: str, overrides: list[str], out: Path):
    """The run of `scenario` with `method` and `overrides`, resumed (or read back) from `out` where it exists; `Ended`
    where it does not complete."""
    config, _ = resolve(scenario, [f"method={method}", f"out={out}", *overrides])
    built = build(config)
    result = run(config, resume=(out / "checkpoint.pt").exists(), progress=False, built=built)
    if result.status != "completed":
        raise Ended(f"{out.name} run {result.status}: {result.message}")
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
    kept = None  # where the method refuses a removal that leaves some weights invalid: that removal, asked for
    if unlearned is None and "keep_invalid=True" in row["refused"]:
        kept = bayesadmm.unlearn(full, args.client, keep_invalid=True)
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


# --- unlearning, then repair rounds, against retraining (--repair) ----------------------------------------------------

VARIANTS = ("retrained", "continued", "unlearned", "kept")  # (a), (b), (c), and (c) with keep_invalid=True


def membership_auc(member_nll: torch.Tensor, other_nll: torch.Tensor) -> float:
    """The AUC of the loss-threshold attack: P(a member's NLL < an unseen example's), ties counted half (the
    Mann-Whitney statistic over the pooled ranks)."""
    pooled = torch.cat([member_nll, other_nll]).double()
    order = pooled.argsort()
    ranks = torch.empty_like(pooled)
    ranks[order] = torch.arange(1, len(pooled) + 1, dtype=pooled.dtype)
    for value in pooled.unique()[torch.unique(pooled, return_counts=True)[1] > 1]:  # ties: their mean rank
        ranks[pooled == value] = ranks[pooled == value].mean()
    n, m = len(member_nll), len(other_nll)
    member_ranks = float(ranks[:n].sum())
    return 1.0 - (member_ranks - n * (n + 1) / 2) / (n * m)  # lower NLL = member, so 1 − U/(nm)


def matched_unseen(forgotten, X_test, y_test, seed: int):
    """Client J's training examples and as many unseen test examples of each of its classes (a seeded draw), both cut
    to the class counts they share, so that the attack cannot tell them apart by class."""
    generator = torch.Generator().manual_seed(seed)
    members, others = [], []
    for label in forgotten.y.unique():
        mine = (forgotten.y == label).nonzero().flatten()
        unseen = (y_test == label).nonzero().flatten()
        unseen = unseen[torch.randperm(len(unseen), generator=generator)]
        n = min(len(mine), len(unseen))
        members.append(mine[:n])
        others.append(unseen[:n])
    members, others = torch.cat(members), torch.cat(others)
    return (forgotten.X[members], forgotten.y[members]), (X_test[others], y_test[others])


def example_nll(result, X, y) -> torch.Tensor:
    """Each example's NLL at the posterior mean."""
    with torch.inference_mode():
        logits = result.model.forward(result.posterior.mean, X)
    return torch.nn.functional.cross_entropy(logits.double(), y, reduction="none")


def score(result, data, seed: int) -> dict:
    """The numbers of one posterior: test metrics, client J's training NLL, the membership AUC."""
    (X_test, y_test), forgotten, (members, others) = data
    return {
        "round": result.round,
        "test": metrics(result, result.posterior, X_test, y_test, seed),
        "client_nll": metrics(result, result.posterior, forgotten.X, forgotten.y, seed)["nll"],
        "membership_auc": membership_auc(example_nll(result, *members), example_nll(result, *others)),
    }


def at_round(run_dir: Path, round_: int):
    """The run in `run_dir` resumed to `round_` (nothing trained where its checkpoint is there), read back."""
    if bayesadmm.load(run_dir).round < round_:
        config = load(run_dir)
        config = type(config)(**{**config.to_json(), "out": str(run_dir), "stop_at": round_})
        result = run(config, resume=True, progress=False)
        if result.round != round_:
            sys.exit(f"{run_dir}: the resume ended {result.status} at round {result.round} ({result.message})")
    result = bayesadmm.load(run_dir)
    if result.round != round_:
        sys.exit(f"{run_dir} is at round {result.round}, past {round_}: remove it to measure round {round_} again")
    return result


def variant(spec: str) -> tuple[str, list[str]]:
    """METHOD or METHOD:KEY=VALUE,KEY=VALUE as the method and its overrides."""
    method, _, settings = spec.partition(":")
    return method, [item for item in settings.split(",") if item]


def repair(spec: str, seed: int, args, points: dict) -> None:
    """Fill `points[spec][seed]` (variant → R → numbers) for one method and seed, saving after each point."""
    method, overrides = variant(spec)
    settings = [f"rounds={args.rounds}", f"seed={seed}", *overrides, *args.set]
    folder = args.runs / f"{spec.replace(':', '-').replace(',', '-').replace('=', '')}-s{seed}"
    mine = points.setdefault(spec, {}).setdefault(str(seed), {})
    if "ended" in mine:
        return  # a training run of this seed did not complete: recorded, not tried again
    try:
        original, built = train(args.scenario, method, settings, folder / "all")
        retrained, _ = train(args.scenario, method, [*settings, f"exclude_client={args.client}"], folder / "retrained")
    except Ended as ended:  # the method's answer at these settings and this seed, kept in the table
        mine["ended"] = str(ended)
        args.save(points)
        return
    forgotten = built.federation.clients(args.client)
    test = (built.federation.eval_X, built.federation.eval_y)
    data = (test, forgotten, matched_unseen(forgotten, *test, seed))
    last = args.rounds + max(args.repair)
    if "retrained" not in mine:
        mine["retrained"] = {"0": score(retrained, data, seed)}
        args.save(points)
    for name in VARIANTS[1:]:
        if name == "kept" and "refused" not in mine.get("unlearned", {}):
            continue  # keep_invalid=True only changes a removal the method refuses by default
        run_dir = folder / ("unlearned-kept" if name == "kept" else name)
        if not run_dir.exists():
            try:
                if name in ("unlearned", "kept"):
                    bayesadmm.unlearn(original, args.client, out=run_dir, rounds=last, keep_invalid=name == "kept")
                else:  # the client leaves; the server keeps whatever it holds of it
                    left = dataclasses.replace(original, unlearned=(args.client,), message="client left")
                    write_run(left, run_dir, last)
            except bayesadmm.UnlearningError as refusal:  # the method's answer, with what explains it
                mine[name] = {"refused": str(refusal), "dual_share_of_precision": dual_share(original, args.client)}
                args.save(points)
                continue
        for R in sorted(args.repair):
            if str(R) not in mine.setdefault(name, {}):
                mine[name][str(R)] = score(at_round(run_dir, args.rounds + R), data, seed)
                args.save(points)


def _mean_std(values: list[float], scale: float, digits: int) -> str:
    mean = statistics.fmean(values) * scale
    spread = f" ± {statistics.stdev(values) * scale:.{digits}f}" if len(values) > 1 else ""
    return f"{mean:.{digits}f}{spread}"


def repair_table(points: dict, args) -> str:
    """Markdown: per method, (a) then (b) and (c) at each R; the mean ± std over the seeds of test accuracy and NLL,
    client J's NLL minus (a)'s and the membership AUC."""
    lines = [
        f"| method | posterior | R | seeds | test acc (%) | test NLL | client {args.client} NLL − (a)'s "
        "| membership AUC |",
        "|---|---|---|---|---|---|---|---|",
    ]
    labels = {
        "retrained": "(a) retrained",
        "continued": "(b) continued",
        "unlearned": "(c) unlearned",
        "kept": "(c) unlearned, keep_invalid=True",
    }
    for spec, seeds in points.items():
        for seed, point in seeds.items():
            if "ended" in point:
                lines.append(f"| {spec} | seed {seed} | | | training {point['ended']} | | | |")
        for name in VARIANTS:
            refused = [s[name] for s in seeds.values() if "refused" in s.get(name, {})]
            if refused:
                share = [r["dual_share_of_precision"] for r in refused if r.get("dual_share_of_precision")]
                why = ""
                if share:
                    duals = _mean_std([x["all_clients"] for x in share], 100, 1)
                    invalid = _mean_std([x["weights_left_invalid"] for x in share], 100, 3)
                    why = f" (the duals' median share of the precision {duals} %; weights left invalid {invalid} %)"
                lines.append(
                    f"| {spec} | {labels[name]} | | {len(refused)} | refused: {refused[0]['refused']}{why} | | | |"
                )
            # keep_invalid=True is the plain removal where nothing is left invalid: its row takes (c) on those seeds
            measured = {seed: s.get(name, {}) for seed, s in seeds.items()}
            if name == "kept" and any(measured.values()):
                measured = {seed: s.get("kept") or s.get("unlearned", {}) for seed, s in seeds.items()}
            for R in [0] if name == "retrained" else sorted(args.repair):
                rows = [
                    (measured[seed][str(R)], s["retrained"]["0"])
                    for seed, s in seeds.items()
                    if str(R) in measured[seed]
                ]
                if not rows:
                    continue
                cells = [
                    _mean_std([row["test"]["acc"] for row, _ in rows], 100, 1),
                    _mean_std([row["test"]["nll"] for row, _ in rows], 1, 3),
                    _mean_std([row["client_nll"] - ref["client_nll"] for row, ref in rows], 1, 3),
                    _mean_std([row["membership_auc"] for row, _ in rows], 1, 3),
                ]
                r = "" if name == "retrained" else str(R)
                lines.append(f"| {spec} | {labels[name]} | {r} | {len(rows)} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def repair_main(args) -> None:
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"{args.scenario}-c{args.client}-repair.json"
    saved = json.loads(path.read_text()) if path.exists() else {}
    settings = {"scenario": args.scenario, "client": args.client, "rounds": args.rounds, "set": args.set}
    if saved and saved["settings"] != settings:
        sys.exit(f"{path} holds points of other settings {saved['settings']}; give another --out")
    points = saved.get("points", {})

    def save(points: dict) -> None:
        text = json.dumps({"settings": settings, "points": points}, indent=1) + "\n"
        path.with_suffix(".tmp").write_text(text)
        path.with_suffix(".tmp").replace(path)

    args.save = save
    for seed in [] if args.table_only else args.seeds:
        for spec in args.methods:
            repair(spec, seed, args, points)
            print(f"{spec} seed {seed}: done", flush=True)
    print(repair_table({spec: points[spec] for spec in args.methods if spec in points}, args))
    print(f"\nnumbers in {path}")


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
    parser.add_argument("--repair", nargs="+", type=int, metavar="R", help="unlearning then R rounds (module doc)")
    parser.add_argument("--seeds", nargs="+", type=int, default=[0], help="the seeds of --repair")
    parser.add_argument("--table-only", action="store_true", help="with --repair: print the table of the points saved")
    args = parser.parse_args()
    if args.repair:
        if min(args.repair) < 0:
            parser.error("--repair takes rounds R >= 0")
        args.runs = args.runs / "repair"
        return repair_main(args)
    try:
        if args.train_only:  # e.g. one process per method, then one without this flag to compare
            for method in args.methods:
                for extra in ([], [f"exclude_client={args.client}"]):
                    train(args.scenario, method, [*common(args), *extra], run_dir(args, method, bool(extra)))
            return
        results = {method: compare(method, args) for method in args.methods}
    except Ended as ended:
        sys.exit(str(ended))
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"{args.scenario}-c{args.client}-s{args.seed}.json"
    settings = {k: v for k, v in vars(args).items() if k not in ("runs", "out")}
    path.write_text(json.dumps({"settings": settings, "kl": KL_NOTE, "results": results}, indent=1) + "\n")
    print(table(results, args))
    print(f"\n{KL_NOTE}; numbers in {path}")


if __name__ == "__main__":
    main()
