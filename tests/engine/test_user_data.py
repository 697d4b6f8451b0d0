"""`bayesadmm.run` checks a user's data against the model and the likelihood before anything is written: each bad
case is one `DataError` (or `TypeError`) of at most two lines naming the client and the fix, and no run directory;
the dtypes and containers it accepts (any integer labels, numpy arrays, lists, integer features) give the numbers of
their int64 / float tensor equivalents."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.data import TensorDataset

import bayesadmm
from bayesadmm import DataError

FEDAVG = {"lr": 0.05, "epochs": 1, "batch_size": 5}


def _data(n_clients=3, n=10, features=4, classes=3, seed=0):
    gen = torch.Generator().manual_seed(seed)
    clients = [
        (torch.randn(n, features, generator=gen), torch.randint(0, classes, (n,), generator=gen))
        for _ in range(n_clients)
    ]
    return clients, (torch.randn(12, features, generator=gen), torch.randint(0, classes, (12,), generator=gen))


def _net(outputs=3, features=4):
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(features, 8), nn.Tanh(), nn.Linear(8, outputs))


def _run(out, clients, test, model=None, **kwargs):
    kwargs = {"algorithm": "fedavg", "hparams": FEDAVG, "rounds": 1, "progress": False, **kwargs}
    return bayesadmm.run(_net() if model is None else model, clients, test, out=out, **kwargs)


def _replace(clients, k, pair):
    return [pair if i == k else c for i, c in enumerate(clients)]


class Squeezed(nn.Module):
    """A one-output head squeezed to (N,): not logits (N, C)."""

    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(4, 1)

    def forward(self, x):
        return self.linear(x).squeeze(-1)


def _nan_features():
    clients, test = _data()
    X = clients[1][0].clone()
    X[3, 1], X[5, 0] = float("nan"), float("inf")
    return _replace(clients, 1, (X, clients[1][1])), test, {}


def _regression(y_of, test_y_of=None, **kwargs):
    clients, test = _data()
    clients = [(X, y_of(X)) for X, _ in clients]
    return clients, (test[0], (test_y_of or y_of)(test[0])), {"likelihood": bayesadmm.GaussianRegression(0.5), **kwargs}


def _case(name):
    """(clients, test, extra run kwargs) of each bad case."""
    clients, test = _data()
    X1, y1 = clients[1]
    if name == "features too wide for the model":
        return [(torch.randn(10, 5), y) for _, y in clients], (torch.randn(12, 5), test[1]), {}
    if name == "one client's features of another width":
        return _replace(clients, 1, (torch.randn(10, 5), y1)), test, {}
    if name == "test set of the wrong width":
        return clients, (torch.randn(12, 5), test[1]), {}
    if name == "label out of range":
        return _replace(clients, 2, (clients[2][0], torch.full((10,), 7))), test, {}
    if name == "negative label":
        return _replace(clients, 2, (clients[2][0], torch.full((10,), -1))), test, {}
    if name == "fewer outputs than classes":
        return clients, test, {"model": _net(outputs=2)}
    if name == "test label out of range":
        return clients, (test[0], torch.full((12,), 5)), {}
    if name == "float labels":
        return _replace(clients, 1, (X1, y1.float())), test, {}
    if name == "one-hot float labels":
        return _replace(clients, 1, (X1, nn.functional.one_hot(y1, 3).float())), test, {}
    if name == "one-hot integer labels":
        return _replace(clients, 1, (X1, nn.functional.one_hot(y1, 3))), test, {}
    if name == "labels of shape (N, 1)":
        return _replace(clients, 1, (X1, y1[:, None])), test, {}
    if name == "outputs not logits (N, C)":
        return clients, test, {"model": Squeezed()}
    if name == "NaN and inf features":
        return _nan_features()
    if name == "NaN regression target":
        y = torch.zeros(10)
        y[4] = float("nan")
        clients, test, kwargs = _regression(lambda X: X[:, 0])
        return _replace(clients, 1, (clients[1][0], y)), test, {**kwargs, "model": nn.Linear(4, 1)}
    if name == "regression targets of another width than the outputs":
        return _regression(lambda X: X[:, :2], model=nn.Linear(4, 3))
    if name == "likelihood fn not finite":
        counts = _replace([(X, torch.ones(10)) for X, _ in clients], 1, (X1, -torch.ones(10)))  # a negative count
        likelihood = bayesadmm.NegLogLikelihood(poisson_nll)
        return counts, (test[0], torch.ones(12)), {"likelihood": likelihood, "model": nn.Linear(4, 1)}
    if name == "X and y of different lengths":
        return _replace(clients, 1, (X1, y1[:-1])), test, {}
    if name == "client without examples":
        return _replace(clients, 1, (X1[:0], y1[:0])), test, {}
    if name == "dataset items not pairs":
        return _replace(clients, 1, [X1[i] for i in range(10)]), test, {}
    if name == "ClientData with a NaN loss":
        model = bayesadmm.FlatModel.from_module(_net())
        objects = {k: bayesadmm.SupervisedData(model, X, y) for k, (X, y) in enumerate(clients)}
        objects[1] = NaNLoss(10)
        return objects, test, {}
    raise AssertionError(name)


def poisson_nll(log_rate, counts):
    """−log Poisson(counts; exp(log_rate)): infinite for a count of −1 (lgamma(0))."""
    return log_rate.exp() - counts * log_rate + torch.lgamma(counts + 1)


class NaNLoss:
    """A ready ClientData whose loss is NaN."""

    def __init__(self, n):
        self.num_examples = n

    def batch_loss(self, theta, idx):
        return theta.sum() * float("nan")


# (case, who the message names, the fix it states)
BAD = [
    ("features too wide for the model", "client 0: the model does not take its features of shape (5,)", "give"),
    ("one client's features of another width", "client 1's examples have features (5,)", "give every client"),
    ("test set of the wrong width", "the test set: the model does not take", "clients' shape (4,)"),
    ("label out of range", "client 2: label 7 is out of range", "give the model 8 outputs"),
    ("negative label", "client 2: label -1 is negative", "map the labels to the class indices 0..2"),
    ("fewer outputs than classes", "label 2 is out of range for the model's 2 outputs", "give the model 3 outputs"),
    ("test label out of range", "the test set: label 5 is out of range", "give the model 6 outputs"),
    ("float labels", "client 1: labels are float32", "y.astype(int) for a numpy array, y.long() for a tensor"),
    ("one-hot float labels", "client 1: labels have shape (10, 3)", "pass y.argmax(1)"),
    ("one-hot integer labels", "client 1: labels have shape (10, 3)", "pass y.argmax(1)"),
    ("labels of shape (N, 1)", "client 1: labels have shape (10, 1)", "pass y.reshape(-1)"),
    ("outputs not logits (N, C)", "client 0: the model's outputs have shape (2,)", "layer of C outputs"),
    ("NaN and inf features", "client 1: 2 of its features are NaN or infinite (the first in example 3)", "drop or"),
    ("NaN regression target", "client 1: 1 of its targets are NaN or infinite (the first in example 4)", "impute"),
    ("regression targets of another width than the outputs", "client 0: targets have shape (2,)", "outputs of shape"),
    ("likelihood fn not finite", "client 1: NegLogLikelihood's loss on its first examples is inf", "check fn"),
    ("X and y of different lengths", "client 1: X has 10 examples but y has 9", "one target per example"),
    ("client without examples", "client 1 has no examples", "leave it out"),
    ("dataset items not pairs", "client 1: a dataset's items must be (input, target) pairs", "give an (X, y) pair"),
    ("ClientData with a NaN loss", "client 1: batch_loss(theta, idx) of its first examples is nan", "ClientData"),
]


@pytest.mark.parametrize("case, who, fix", BAD, ids=[case for case, _, _ in BAD])
def test_bad_data_is_one_clear_error_before_anything_is_written(tmp_path, case, who, fix):
    clients, test, kwargs = _case(case)
    out = tmp_path / "run"
    with pytest.raises(DataError) as error:
        _run(out, clients, test, **kwargs)
    message = str(error.value)
    assert who in message and fix in message, message
    assert message.count("\n") <= 1, message
    assert not out.exists()


def test_nan_features_are_a_data_error_not_a_divergence(tmp_path):
    clients, test, _ = _nan_features()
    with pytest.raises(ValueError, match="NaN or infinite") as error:
        _run(tmp_path / "run", clients, test)
    assert "learning rate" not in str(error.value) and not (tmp_path / "run").exists()


def test_hparams_must_be_a_mapping(tmp_path):
    clients, test = _data()
    with pytest.raises(TypeError, match=r"hparams must be a mapping .* got list; .* pass dict\(pairs\)") as error:
        _run(tmp_path / "run", clients, test, hparams=list(FEDAVG.items()))
    assert str(error.value).count("\n") == 0 and not (tmp_path / "run").exists()


def _same_numbers(a, b):
    timing = {"seconds", "eval_seconds"}
    strip = [[{k: v for k, v in line.items() if k not in timing} for line in run.history] for run in (a, b)]
    return strip[0] == strip[1] and torch.equal(a.posterior.mean, b.posterior.mean)


GOOD = {
    "uint8 labels (FashionMNIST's dtype)": lambda X, y: (X, y.to(torch.uint8)),
    "int32 labels": lambda X, y: (X, y.to(torch.int32)),
    "int16 labels": lambda X, y: (X, y.to(torch.int16)),
    "numpy arrays": lambda X, y: (X.numpy(), y.numpy()),
    "numpy uint8 labels": lambda X, y: (X.numpy(), y.numpy().astype(np.uint8)),
    "lists of numbers": lambda X, y: (X.tolist(), y.tolist()),
    "a TensorDataset with uint8 labels": lambda X, y: TensorDataset(X, y.to(torch.uint8)),
    "a Dataset of numpy pairs": lambda X, y: [(x, int(t)) for x, t in zip(X.numpy(), y.tolist(), strict=True)],
}


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """One round on int64 labels and float tensors, the numbers every accepted form must give (in float64, as the
    tests run: the module's fixture is made before tests/conftest.py sets the default dtype for a test)."""
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        return _run(tmp_path_factory.mktemp("reference") / "run", *_data())
    finally:
        torch.set_default_dtype(old)


@pytest.mark.parametrize("form", list(GOOD))
def test_accepted_forms_give_the_numbers_of_int64_tensors(tmp_path, reference, form):
    clients, test = _data()
    convert = GOOD[form]
    result = _run(tmp_path / "converted", [convert(X, y) for X, y in clients], convert(*test))
    assert result.status == "completed" and _same_numbers(result, reference)


def test_integer_features_are_cast_to_the_models_float_dtype(tmp_path):
    gen = torch.Generator().manual_seed(1)
    clients = [(torch.randint(0, 256, (10, 4), generator=gen, dtype=torch.uint8), y) for _, y in _data()[0]]
    test = (torch.randint(0, 256, (12, 4), generator=gen, dtype=torch.uint8), _data()[1][1])
    as_floats = _run(tmp_path / "floats", [(X.double(), y) for X, y in clients], (test[0].double(), test[1]))
    result = _run(tmp_path / "ints", clients, test)
    assert _same_numbers(result, as_floats)


def test_integer_features_an_embedding_takes_are_kept(tmp_path):
    """Token ids into an nn.Embedding: the model takes the integers as they are, so they are not cast."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Embedding(20, 4), nn.Flatten(), nn.Linear(12, 3))
    gen = torch.Generator().manual_seed(2)
    clients = [
        (torch.randint(0, 20, (10, 3), generator=gen), torch.randint(0, 3, (10,), generator=gen)) for _ in range(3)
    ]
    test = (torch.randint(0, 20, (12, 3), generator=gen), torch.randint(0, 3, (12,), generator=gen))
    assert _run(tmp_path / "run", clients, test, model=model).status == "completed"
    with pytest.raises(DataError, match=r"client 1: the model does not take its features of shape \(3,\)"):
        _run(tmp_path / "bad", _replace(clients, 1, (clients[1][0] + 20, clients[1][1])), test, model=model)
    assert not (tmp_path / "bad").exists()


def test_a_flower_node_checks_its_own_data(tmp_path):
    from bayesadmm.flower.loaders import node_data, save_tensors

    model = bayesadmm.FlatModel.from_module(_net())
    X, y = _data()[0][0]
    good = save_tensors(tmp_path / "good.npz", X, y.to(torch.uint8))
    data = node_data({"data": str(good)}, model, bayesadmm.Classification(), "cpu", client=3)
    assert data is not None and data.y.dtype == torch.int64 and torch.equal(data.y, y)
    bad = save_tensors(tmp_path / "bad.npz", X, torch.full((10,), 9))
    with pytest.raises(DataError, match="client 3: label 9 is out of range for the model's 3 outputs"):
        node_data({"data": str(bad)}, model, bayesadmm.Classification(), "cpu", client=3)
