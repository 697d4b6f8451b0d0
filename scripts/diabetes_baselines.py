"""Two reference points for the diabetes-iid5 table: predicting the training mean, and least squares on all the
training rows at once (no federation), on each seed's split as `bayesadmm run diabetes-iid5 seed=S` makes it, scored
on its test rows with the preset's Gaussian likelihood.

    python scripts/diabetes_baselines.py          # seeds 0, 1, 2
"""

from __future__ import annotations

import statistics
import sys

import torch

from bayesadmm.data.tabular import standardise
from bayesadmm.experiments.build import load_data
from bayesadmm.experiments.config import resolve


def baselines(seed: int) -> dict[str, dict[str, float]]:
    config, _ = resolve("diabetes-iid5", [f"seed={seed}"])
    data = load_data(config)
    X, X_test = (t.double() for t in standardise(data.X, data.X_test))
    y, y_test = (t.double() for t in standardise(data.y, data.y_test))
    likelihood = config.make_likelihood()
    ones, test_ones = torch.ones(len(y), 1, dtype=X.dtype), torch.ones(len(y_test), 1, dtype=X.dtype)
    weights = torch.linalg.lstsq(torch.cat([X, ones], 1), y.unsqueeze(1)).solution
    predictions = {
        "training mean": torch.zeros_like(y_test),  # the standardised targets' training mean is 0
        "least squares": (torch.cat([X_test, test_ones], 1) @ weights).squeeze(1),
    }
    scores = {}
    for name, f in predictions.items():
        metrics = likelihood.metrics(likelihood.predictive(f.unsqueeze(0)), y_test)
        scores[name] = {key: metrics[key] for key in ("rmse", "nll")}
    return scores


def main(seeds: list[int]) -> None:
    runs = {seed: baselines(seed) for seed in seeds}
    for name in runs[seeds[0]]:
        cells = []
        for key in ("rmse", "nll"):
            values = [runs[s][name][key] for s in seeds]
            per_seed = ", ".join(f"{v:.3f}" for v in values)
            spread = statistics.stdev(values) if len(values) > 1 else 0.0
            cells.append(f"{key} {statistics.fmean(values):.3f} ± {spread:.3f} ({per_seed})")
        print(f"{name}: " + "; ".join(cells))


if __name__ == "__main__":
    main([int(s) for s in sys.argv[1:]] or [0, 1, 2])
