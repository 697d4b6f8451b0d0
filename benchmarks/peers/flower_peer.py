"""The Flower contender: a standard Flower 1.42 app (Message API) run by the Simulation Runtime on Ray.

* ClientApp (`client_app`): `@train()` loads its client's (X_k, y_k) by its node config's ``partition-id`` (saved by
  the driver as client<K>.pt, cached per process), builds the MLP from the received ArrayRecord, trains with the
  shared `local_update` functions, and replies an ArrayRecord plus a MetricRecord with ``num-examples``. IVON-ADMM's
  duals (v_k, u_k) live in the node's ``context.state`` between rounds.
* ServerApp: `flwr.serverapp.strategy.FedAvg` (subclassed only to time each round and, for IVON-ADMM, to replace the
  average by the IVON-ADMM server step), started with the scenario's initial weights; no client-side evaluation.
  A round's time runs from `configure_train` to the end of `aggregate_train` (time.perf_counter), so Ray's start-up
  and the final evaluation are outside it.
* `run_flower`: `flwr.simulation.run_simulation` with the Ray backend, each ClientApp taking one CPU (so two run at
  once on a 2-core machine), or on a GPU one CPU and a fraction of the GPU (`num_gpus` 0.25: four at once), with the
  model and each minibatch moved there; Ray is shut down at the end.
"""

from __future__ import annotations

import logging
import os
import time
import warnings
from pathlib import Path

import torch
from common import ROUNDS, Scenario, accuracy, cosine_lr, make_mlp
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg
from local_update import fedavg_update, ivon_admm_server, ivon_admm_update
from torch.utils.data import DataLoader, TensorDataset

HPARAMS = (
    "lr",
    "epochs",
    "batch_size",
    "rho",
    "tau",
    "gamma",
    "delta",
    "hess_init",
    "beta1",
    "beta2",
    "restart_at_q_g",
    "cosine",
)
_partitions: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}

client_app = ClientApp()


def _partition(data_dir: str, pid: int) -> tuple[torch.Tensor, torch.Tensor]:
    path = str(Path(data_dir) / f"client{pid}.pt")
    if path not in _partitions:
        _partitions[path] = torch.load(path)
    return _partitions[path]


@client_app.train()
def train(msg: Message, context: Context) -> Message:
    config = msg.content["config"]
    pid = int(context.node_config["partition-id"])
    X, y = _partition(str(config["data-dir"]), pid)
    loader = DataLoader(TensorDataset(X, y), batch_size=int(config["batch_size"]), shuffle=True)
    hp = {k: config[k] for k in HPARAMS if k in config}
    device = str(config["device"])
    model = make_mlp().to(device)
    metrics = MetricRecord({"num-examples": len(y), "unit-weight": 1})
    if config["method"] == "fedavg":
        model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
        fedavg_update(model, loader, float(hp["lr"]), int(hp["epochs"]), device)
        arrays = ArrayRecord(model.state_dict())
    else:
        server = msg.content["arrays"].to_torch_state_dict()
        m_g, s_g = server["m"].to(device), server["s"].to(device)
        if "duals" not in context.state:
            context.state["duals"] = ArrayRecord({"v": torch.zeros_like(m_g), "u": torch.zeros_like(m_g)})
        duals = {k: v.to(device) for k, v in context.state["duals"].to_torch_state_dict().items()}
        round_ = int(config["server-round"])
        lr = cosine_lr(hp["lr"], round_, int(config["schedule-rounds"])) if hp.get("cosine") else hp["lr"]
        v_k, u_k, a, b = ivon_admm_update(
            model, loader, m_g, s_g, duals["v"], duals["u"], hp, round_, lr, len(y), device
        )
        context.state["duals"] = ArrayRecord({"v": v_k, "u": u_k})
        arrays = ArrayRecord({"a": a, "b": b})
    return Message(content=RecordDict({"arrays": arrays, "metrics": metrics}), reply_to=msg)


class TimedStrategy(FedAvg):
    """FedAvg that records each round's seconds; with `ivon_admm` set, the server step is IVON-ADMM's."""

    def __init__(self, *args, ivon_admm: dict | None = None, num_clients: int = 0, **kwargs):
        super().__init__(*args, **kwargs)
        self.ivon_admm, self.num_clients = ivon_admm, num_clients
        self.seconds: list[float] = []
        self.began = 0.0

    def configure_train(self, server_round, arrays, config, grid):
        self.began = time.perf_counter()
        return super().configure_train(server_round, arrays, config, grid)

    def aggregate_train(self, server_round, replies):
        if self.ivon_admm is None:
            arrays, metrics = super().aggregate_train(server_round, replies)
        else:
            replies = list(replies)
            good = [r.content["arrays"].to_torch_state_dict() for r in replies if not r.has_error()]
            if len(good) != len(replies):
                raise RuntimeError(f"round {server_round}: {len(replies) - len(good)} client(s) failed")
            m_g, s_g = ivon_admm_server(
                sum(g["a"] for g in good), sum(g["b"] for g in good), self.ivon_admm, self.num_clients
            )
            arrays, metrics = ArrayRecord({"m": m_g, "s": s_g}), None
        self.seconds.append(time.perf_counter() - self.began)
        return arrays, metrics


def run_flower(
    scenario: Scenario,
    data_dir: str,
    rounds: int = ROUNDS,
    device: str = "cpu",
    gpus: float = 0.25,
    fraction: float = 1.0,
) -> dict:
    """`rounds` rounds of the Flower app; returns {"seconds": [...], "acc": ..., ("ens_acc": ...)}. With a CUDA
    `device` each ClientApp trains there and asks Ray for `gpus` of the GPU (so 1/gpus of them run at once), as
    Flower's guides set `client_resources`; otherwise one CPU each. `fraction`: the share of the clients that train
    each round (Flower's fraction-train)."""
    from flwr.simulation import run_simulation

    K, hp = len(scenario.clients), scenario.hparams
    for k, (X, y) in enumerate(scenario.clients):
        torch.save((X, y), Path(data_dir) / f"client{k}.pt")
    ivon = scenario.method == "ivon-admm"
    out: dict = {}
    server_app = ServerApp()

    @server_app.main()
    def main(grid: Grid, context: Context) -> None:
        weighting = "num-examples" if hp.get("weighted", False) else "unit-weight"
        strategy = TimedStrategy(
            fraction_train=fraction,
            fraction_evaluate=0.0,
            min_train_nodes=max(1, round(fraction * K)),
            min_available_nodes=K,
            weighted_by_key=weighting,
            ivon_admm=hp if ivon else None,
            num_clients=K,
        )
        if ivon:
            initial = ArrayRecord({"m": scenario.theta0, "s": torch.full_like(scenario.theta0, hp["delta"])})
        else:
            model = make_mlp()
            torch.nn.utils.vector_to_parameters(scenario.theta0.clone(), model.parameters())
            initial = ArrayRecord(model.state_dict())
        config = ConfigRecord(
            {
                "method": scenario.method,
                "device": device,
                "data-dir": data_dir,
                "schedule-rounds": scenario.schedule_rounds,
                **{k: v for k, v in hp.items() if k in HPARAMS},
            }
        )
        result = strategy.start(grid=grid, initial_arrays=initial, num_rounds=rounds, train_config=config)
        out["seconds"], out["arrays"] = strategy.seconds, result.arrays.to_torch_state_dict()

    logging.getLogger("flwr").setLevel(logging.WARNING)
    if torch.device(device).type == "cuda":
        resources = {"num_cpus": 1, "num_gpus": gpus}
        init_args = {"num_cpus": os.cpu_count() or 1, "num_gpus": 1}
    else:
        resources, init_args = {"num_cpus": 1, "num_gpus": 0.0}, {"num_cpus": 2}
    backend_config = {"client_resources": resources, "init_args": init_args}
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            run_simulation(server_app, client_app, num_supernodes=K, backend_config=backend_config)
    finally:
        shutdown_ray()
    if "seconds" not in out:
        raise RuntimeError("the Flower simulation ended without a result; see Flower's log above")
    if ivon:
        theta, precision = out["arrays"]["m"], out["arrays"]["s"]
        return {
            "seconds": out["seconds"],
            "acc": accuracy(theta, scenario.X_test, scenario.y_test),
            "ens_acc": accuracy(theta, scenario.X_test, scenario.y_test, precision),
        }
    model = make_mlp()
    model.load_state_dict(out["arrays"])
    theta = torch.nn.utils.parameters_to_vector(model.parameters()).detach()
    return {"seconds": out["seconds"], "acc": accuracy(theta, scenario.X_test, scenario.y_test)}


def shutdown_ray() -> None:
    try:
        import ray
    except ImportError:
        return
    if ray.is_initialized():
        ray.shutdown()
