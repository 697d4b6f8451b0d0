"""`bayesadmm paper fedep-toy` (FedEP Table 4, Figs. 1 and 4-left) on a few client pairs."""

import json
import math
from pathlib import Path

from bayesadmm.cli import main


def test_fedep_toy_command(tmp_path: Path):
    assert main(["paper", "fedep-toy", "--out", str(tmp_path), "--rounds", "30", "--set", "pairs=12"]) == 0
    result = json.loads((tmp_path / "fedep_toy.json").read_text())
    for name in ("fedavg", "fedpa", "fedep", "fedep-identity"):
        mean, std = result[name]
        assert math.isfinite(mean) and std >= 0
    assert result["rounds"] == list(range(1, 31))
    assert set(result["per_round"]) == {"fedep", "fedep-identity"}
    assert all(len(v["mean"]) == 30 for v in result["per_round"].values())
    assert result["fedep"][0] < 1e-9                       # EP reaches the exact global mean (float64)
    assert result["fedpa"][0] < result["fedavg"][0]
    # round 1 of EP from the uniform start is FedPA
    assert abs(result["per_round"]["fedep"]["mean"][0] - result["fedpa"][0]) < 1e-12
    assert result["settings"]["pairs"] == 12
    fig1 = result["fig1"]
    # Fig. 1: after its 10 EP rounds the trajectory is far closer to the target than FedPA and FedAvg
    ep_err = math.dist(fig1["fedep_trajectory"][-1], fig1["target"])
    assert ep_err < 0.05 and 100 * ep_err < math.dist(fig1["fedpa"], fig1["target"]) < math.dist(fig1["fedavg"],
                                                                                                fig1["target"])
    assert (tmp_path / "fedep_toy_fig1.png").stat().st_size > 10_000
    assert (tmp_path / "fedep_toy_fig4.png").stat().st_size > 10_000
