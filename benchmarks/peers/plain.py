"""The plain contender: the hand-written PyTorch federated loop a user writes in an afternoon.

A DataLoader per client (shuffle=True, the scenario's batch size), the nn.Sequential MLP started from the scenario's
initial weights, the clients trained one after another in this process with torch's default threads, then the
server average (FedAvg: unweighted as bayesadmm's default, N_k-weighted with weighted=true) or the IVON-ADMM server
step. On a GPU (`device`), the model, the weights and the server's state live there and each minibatch is moved
there from the CPU DataLoader, as PyTorch's tutorials do. Each round is timed with time.perf_counter around the
client updates and the server step (after the device's queue has run).
"""

from __future__ import annotations

import time

import torch
from common import ROUNDS, Scenario, accuracy, cosine_lr, flat, make_mlp
from local_update import fedavg_update, ivon_admm_server, ivon_admm_update
from torch.utils.data import DataLoader, TensorDataset


def loaders(scenario: Scenario) -> list[DataLoader]:
    return [DataLoader(TensorDataset(X, y), batch_size=scenario.batch_size, shuffle=True) for X, y in scenario.clients]


def run_plain(scenario: Scenario, rounds: int = ROUNDS, threads: int = 0, device: str = "cpu") -> dict:
    """`rounds` rounds on `device`; returns {"seconds": [per round], "acc": test accuracy after the last,
    "ens_acc": ...}. `threads`: torch's intra-op threads for the run (0: leave torch's default)."""
    default = torch.get_num_threads()
    if threads:
        torch.set_num_threads(threads)
    try:
        return _run(scenario, rounds, device)
    finally:
        torch.set_num_threads(default)


def _run(scenario: Scenario, rounds: int, device: str) -> dict:
    torch.manual_seed(scenario.seed)
    hp, K = scenario.hparams, len(scenario.clients)
    data = loaders(scenario)
    sizes = torch.tensor([float(len(y)) for _, y in scenario.clients], device=device)
    model = make_mlp().to(device)
    theta = scenario.theta0.to(device)
    precision = None
    if scenario.method == "ivon-admm":
        precision = torch.full_like(theta, hp["delta"])  # s_g starts at the prior's precision δ
        duals = [(torch.zeros_like(theta), torch.zeros_like(theta)) for _ in range(K)]
    seconds = []
    for round_ in range(1, rounds + 1):
        began = time.perf_counter()
        if scenario.method == "fedavg":
            thetas = []
            for loader in data:
                torch.nn.utils.vector_to_parameters(theta.clone(), model.parameters())
                fedavg_update(model, loader, hp["lr"], hp["epochs"], device)
                thetas.append(flat(model))
            stacked = torch.stack(thetas)
            if hp.get("weighted", False):
                theta = (stacked * sizes[:, None]).sum(0) / sizes.sum()
            else:
                theta = stacked.mean(0)
        else:
            lr = cosine_lr(hp["lr"], round_, scenario.schedule_rounds) if hp.get("cosine") else hp["lr"]
            a_sum, b_sum = torch.zeros_like(theta), torch.zeros_like(theta)
            for k, loader in enumerate(data):
                v_k, u_k, a, b = ivon_admm_update(
                    model, loader, theta, precision, *duals[k], hp, round_, lr, len(scenario.clients[k][1]), device
                )
                duals[k] = (v_k, u_k)
                a_sum += a
                b_sum += b
            theta, precision = ivon_admm_server(a_sum, b_sum, hp, K)
        if theta.is_cuda:
            torch.cuda.synchronize()
        seconds.append(time.perf_counter() - began)
    theta = theta.cpu()
    precision = None if precision is None else precision.cpu()
    result = {"seconds": seconds, "acc": accuracy(theta, scenario.X_test, scenario.y_test)}
    if precision is not None:
        result["ens_acc"] = accuracy(theta, scenario.X_test, scenario.y_test, precision)
    return result
