"""FedEP, FedSEP and FedPA on small networks with the four tilted-inference methods (I, L, M, V): round 1 of FedEP
from a uniform start is FedPA for every method, FedPA's chains start at the global mean, two rounds of every
registered variant lower the training loss, and the configuration accepts the new keys."""

import dataclasses

import pytest
import torch
from torch import nn

from bayesadmm import algorithms
from bayesadmm.algorithms import fedep, fedpa, fedsep
from bayesadmm.algorithms.base import unpack
from bayesadmm.algorithms.ep_common import TiltedSettings, tilted_inference
from bayesadmm.engine.simulate import run_rounds
from bayesadmm.experiments.config import ConfigError, method_parameters, resolve
from bayesadmm.families import DiagonalGaussian
from bayesadmm.families import natural as nat
from bayesadmm.models import FlatModel
from bayesadmm.problems.neural import ClassificationData
from bayesadmm.solvers.adam import LocalAdam
from bayesadmm.solvers.ep_inference import NGVI, SGMCMC, Laplace, ScaledIdentity


def _clients(build, K=3, n=30, d=4, classes=3, seed=0):
    """K clients with label-skewed Gaussian blobs (each client sees mostly two of the classes)."""
    model = FlatModel(build)
    g = torch.Generator().manual_seed(seed)
    centres = 2.0 * torch.randn(classes, d, generator=g)
    clients = []
    for k in range(K):
        y = torch.tensor([(k + i % 2) % classes if i % 5 else i % classes for i in range(n)])
        X = centres[y] + torch.randn(n, d, generator=g)
        clients.append(ClassificationData(model, X, y))
    return model, clients


def _train_loss(clients, theta):
    X = torch.cat([c.X for c in clients])
    y = torch.cat([c.y for c in clients])
    return float(torch.nn.functional.cross_entropy(clients[0].model.forward(theta, X), y))


def _build(method, model, clients, **hparams):
    """As the engine does: the method's spec built with the engine's context."""
    sizes = {k: c.num_examples for k, c in enumerate(clients)}
    return algorithms.make(method, dim=model.dim, model=model, client_sizes=sizes, **hparams)


SETTINGS = {"identity": {}, "laplace": {}, "mcmc": {"mcmc_lr": 0.05, "shrinkage": 1e-3},
            "ngvi": {"ngvi_epochs": 2, "ngvi_samples": 2}}


@pytest.mark.parametrize("inference", sorted(SETTINGS))
@pytest.mark.parametrize("method", ["fedep", "fedsep", "fedpa"])
def test_two_rounds_lower_the_training_loss(method, inference):
    model, clients = _clients(lambda: nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 3)))
    theta0 = model.initial_params(torch.Generator().manual_seed(0))
    alg = _build(method, model, clients, inference=inference, lr=0.05, epochs=5, batch_size=10, alpha=0.05,
                 **SETTINGS[inference])
    assert alg.name == method
    server, _ = run_rounds(alg, clients, theta0, rounds=2)
    post = alg.posterior(server)
    assert torch.isfinite(post.mean).all() and bool((post.precision > 0).all())
    before, after = _train_loss(clients, theta0), _train_loss(clients, post.mean)
    assert after < 0.8 * before, (before, after)


INFERENCES = {
    "I": lambda s: ScaledIdentity(alpha=0.05, solver=s),
    "L": lambda s: Laplace(alpha=0.05, solver=s),
    "M": lambda s: SGMCMC(alpha=0.05, shrinkage=1e-3, lr=0.05, epochs=5, batch_size=10),
    "V": lambda s: NGVI(alpha=0.05, epochs=2, samples=2, batch_size=10, solver=s),
}


@pytest.mark.parametrize("label", sorted(INFERENCES))
def test_round_one_of_fedep_from_a_uniform_start_is_fedpa_for_every_neural_inference(label):
    """Uniform prior and sites, no damping, θ_0 = 0 (the uniform cavity's mean, where FedEP's local training starts,
    and FedPA's θ_0): the cavity is uniform for both, so their round-1 posteriors coincide; round 2 differs."""
    model, clients = _clients(lambda: nn.Linear(4, 3), seed=1)
    family = DiagonalGaussian(model.dim)
    inference = INFERENCES[label](LocalAdam(lr=0.05, epochs=5, batch_size=10))
    ep = fedep.make(family, inference, damping=1.0, num_clients=len(clients))
    pa = fedpa.make(family, inference)
    theta0 = torch.zeros(model.dim)
    s_ep, _ = run_rounds(ep, clients, theta0, 1)
    s_pa, _ = run_rounds(pa, clients, theta0, 1)
    assert nat.allclose(s_ep.natural, s_pa.natural, rtol=0, atol=1e-12)
    s_ep2, _ = run_rounds(ep, clients, theta0, 2)
    s_pa2, _ = run_rounds(pa, clients, theta0, 2)
    assert not nat.allclose(s_ep2.natural, s_pa2.natural, atol=1e-6)


def test_fedpa_chains_start_at_the_global_mean_with_a_uniform_cavity():
    model, clients = _clients(lambda: nn.Linear(4, 3), K=2, seed=2)
    family = DiagonalGaussian(model.dim)
    calls = []
    inner = ScaledIdentity(alpha=0.05, solver=LocalAdam(lr=0.05, epochs=2, batch_size=10))

    def spy(family_, data, cavity, generator, start=None):
        calls.append((cavity, start))
        return inner(family_, data, cavity, generator, start=start)

    alg = fedpa.make(family, spy, prior_precision=1.0)
    theta0 = torch.linspace(-1, 1, model.dim)
    server = alg.init_server(theta0)
    means = []
    for _ in range(2):
        message = alg.broadcast(server)
        replies = {k: alg.client_update(alg.init_client(server, k), message, c, torch.Generator().manual_seed(k))[1]
                   for k, c in enumerate(clients)}
        server, _ = alg.server_update(server, replies)
        means.append(alg.posterior(server).mean)
        # the product: prior + Σ_k local approximations
        prior = (torch.zeros(model.dim), -0.5 * torch.ones(model.dim))
        assert nat.allclose(server.natural, nat.add(prior, nat.total([unpack("local", r) for r in replies.values()])),
                            atol=1e-12)
    assert all(nat.allclose(cavity, nat.zeros_like(cavity), atol=0) for cavity, _ in calls)
    assert all(torch.equal(start, theta0) for _, start in calls[:2])             # round 1: θ_0
    assert all(torch.allclose(start, means[0], atol=1e-12) for _, start in calls[2:])   # round 2: mean of q_g
    assert not torch.allclose(means[0], theta0)


def test_configuration_accepts_the_inference_keys():
    config, _ = resolve("fmnist-heterog10", ["method=fedpa", "inference=ngvi", "shrinkage=1e-3", "ngvi_beta=0.9",
                                             "ngvi_epochs=2", "ngvi_samples=3", "mcmc_lr=0.05", "ngvi_debias=false"])
    assert config.method == "fedpa"
    # the command line over the preset's FedPA settings
    assert config.hparams.items() >= {"lr": 1e-3, "epochs": 10, "batch_size": 32, "alpha": 1e-2, "inference": "ngvi",
                                      "shrinkage": 1e-3, "ngvi_beta": 0.9, "ngvi_epochs": 2, "ngvi_samples": 3,
                                      "mcmc_lr": 0.05, "ngvi_debias": False}.items()
    assert isinstance(config.hparams["ngvi_epochs"], int)
    for method in ("fedep", "fedsep"):
        config, _ = resolve("fmnist-heterog10", [f"method={method}", "inference=mcmc", "mcmc_momentum=0.5"])
        assert config.hparams.items() >= {"lr": 1e-3, "epochs": 10, "batch_size": 32, "alpha": 1e-2,
                                          "inference": "mcmc", "mcmc_momentum": 0.5}.items()
    assert {"dim", "num_clients", "client_sizes"}.isdisjoint(method_parameters("fedpa"))
    assert "damping" not in method_parameters("fedpa")                         # FedPA multiplies, it does not damp
    with pytest.raises(ConfigError, match="ngvi_epochs must be int"):
        resolve("fmnist-heterog10", ["method=fedep", "ngvi_epochs=many"])
    with pytest.raises(ValueError, match="inference must be one of"):
        algorithms.make("fedpa", dim=3, inference="gibbs")
    with pytest.raises(ValueError, match="shrinkage"):
        algorithms.make("fedep", dim=3, num_clients=2, client_sizes={0: 1, 1: 1}, inference="mcmc", shrinkage=2.0)


def test_the_inference_names_map_to_objects_and_fedsep_is_built_as_fedep():
    settings = TiltedSettings(alpha=0.05, fisher_samples=2, lr=0.01, epochs=3, batch_size=8,
                                 shrinkage=1e-3, mcmc_lr=0.02, mcmc_momentum=0.5, ngvi_beta=0.9, ngvi_epochs=2,
                                 ngvi_samples=4, ngvi_debias=False)
    solver = LocalAdam(lr=0.01, epochs=3, batch_size=8)
    def tilted(name):
        return tilted_inference(dataclasses.replace(settings, inference=name), "fedep")

    assert tilted("identity") == ScaledIdentity(alpha=0.05, solver=solver)
    assert tilted("laplace") == Laplace(alpha=0.05, fisher_samples=2, solver=solver)
    assert tilted("mcmc") == SGMCMC(alpha=0.05, shrinkage=1e-3, lr=0.02, momentum=0.5, epochs=3, batch_size=8)
    assert tilted("ngvi") == NGVI(alpha=0.05, beta=0.9, epochs=2, samples=4, batch_size=8, fisher_samples=2,
                                  debias=False, solver=solver)
    sizes = {0: 3, 1: 1}
    alg = algorithms.make("fedsep", dim=2, client_sizes=sizes)
    assert alg.name == "fedsep"
    assert alg.init_client(alg.init_server(torch.zeros(2)), 0) == fedsep.ClientState(0.75)
