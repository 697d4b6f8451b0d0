"""The cross-device scenarios (`fmnist-xdevice`, `logreg-100k`) on small slices: FedAvg, IVON-ADMM and FedSEP
complete and resume with the uninterrupted run's numbers, with the client states in memory or on disk; and the
`sized-dirichlet` split they use."""

from __future__ import annotations

import json

import pytest
import torch

from bayesadmm.cli import main
from bayesadmm.data.partitions import make_partition
from conftest import needs_fmnist

SLICES = {  # a few hundred examples over 40 clients, 4 per round
    "fmnist-xdevice": ["data_fraction=0.01", "clients=40", "participation=0.1", "epochs=1"],
    "logreg-100k": ["data_fraction=0.001", "clients=40", "participation=0.1", "epochs=1"],
}


def _lines(run_dir):
    return [{k: v for k, v in json.loads(line).items() if not k.endswith("seconds")}
            for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(autouse=True)
def _no_plots(monkeypatch):
    monkeypatch.setattr("bayesadmm.evaluation.diagrams.try_plot_run", lambda *args, **kwargs: None)


def _scenario(scenario):
    return pytest.param(scenario, marks=needs_fmnist) if scenario == "fmnist-xdevice" else scenario


@pytest.mark.parametrize("scenario", [_scenario("fmnist-xdevice"), "logreg-100k"])
@pytest.mark.parametrize("method", ["fedavg", "ivon-admm", "fedsep"])
def test_the_scale_scenarios_complete_and_resume(scenario, method, tmp_path):
    common = [scenario, f"method={method}", *SLICES[scenario], "rounds=3", "eval_samples=2", "workers=1", "--quiet"]
    whole, split = tmp_path / "whole", tmp_path / "split"
    assert main(["run", *common, f"out={whole}"]) == 0
    assert main(["run", *common, "stop_at=2", "client_store=disk", f"out={split}"]) == 0
    assert main(["resume", str(split), "--quiet"]) == 0
    assert _lines(split) == _lines(whole)
    assert [line["participants"] for line in _lines(whole)] == [4, 4, 4]


def test_sized_dirichlet_gives_every_client_its_floor_and_its_own_label_mix():
    labels = torch.arange(6000) % 10
    parts = make_partition("sized-dirichlet", labels, 1000, torch.Generator().manual_seed(0), floor=3)
    again = make_partition("sized-dirichlet", labels, 1000, torch.Generator().manual_seed(0), floor=3)
    assert all(torch.equal(a, b) for a, b in zip(parts, again, strict=True))
    assert sorted(torch.cat(parts).tolist()) == list(range(6000))  # every example once
    sizes = torch.tensor([len(p) for p in parts])
    assert int(sizes.min()) >= 3 and int(sizes.max()) > 12  # Dirichlet sizes above the floor
    # label skew: a client's commonest label is more of its data than under an even mix of the 10 labels
    top = [torch.bincount(labels[p], minlength=10).max().item() / len(p) for p in parts if len(p) >= 10]
    even = torch.Generator().manual_seed(1)
    draws = [torch.randint(0, 10, (len(p),), generator=even) for p in parts if len(p) >= 10]
    top_even = [torch.bincount(d, minlength=10).max().item() / len(d) for d in draws]
    assert sum(top) / len(top) > sum(top_even) / len(top_even) + 0.1
    with pytest.raises(ValueError, match="cannot give 1000 clients 7 examples"):
        make_partition("sized-dirichlet", labels, 1000, torch.Generator(), floor=7)
