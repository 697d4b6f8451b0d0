"""A run on Flower's Simulation Runtime (Ray): the same ServerApp and ClientApp as a deployment, N virtual SuperNodes.

`run_simulation(config)` is what the equivalence test compares with the local engine. Flower marks its Python
`run_simulation` deprecated in favour of `flwr run` against a local SuperLink in simulation mode; that path starts a
detached SuperLink under $FLWR_HOME, which is worse for a library call and a test, so this uses the Python API.
The virtual nodes get ``partition-id``/``num-partitions`` from the runtime, as `--node-config` gives real ones.

Beyond one machine: `address` names a running Ray cluster (``ray start --head`` on one machine, ``ray start
--address=HEAD:6379`` on the others), whose nodes then run the ClientApps, one CPU each (docs/deploy.md).
"""

from __future__ import annotations

import warnings

import torch
from flwr.app import ConfigRecordValues

from bayesadmm.experiments.config import RunConfig
from bayesadmm.flower.client_app import app as client_app
from bayesadmm.flower.server_app import Timeouts, make_server_app


def run_simulation(
    config: RunConfig, timeouts: Timeouts | None = None, cpus: int | None = None, address: str | None = None
) -> None:
    """Run `config` with `config.clients` virtual SuperNodes; the run directory is written as by a local run.

    `cpus` bounds Ray on this machine (default: all cores); `address` joins a running Ray cluster instead (e.g.
    "HEAD:6379"), whose nodes run the ClientApps. Each ClientApp takes one CPU. Raises if the ServerApp failed."""
    from flwr.simulation import run_simulation as flower_run_simulation

    # on a GPU every ClientApp needs to see it (Ray hides GPUs from actors that ask for none); they share it
    gpus = 1.0 / max(config.clients, 1) if torch.device(config.device).type == "cuda" else 0.0
    backend_config: dict[str, dict[str, ConfigRecordValues]] = {"client_resources": {"num_cpus": 1, "num_gpus": gpus}}
    if address is not None:
        backend_config["init_args"] = {"address": address}
    elif cpus is not None:
        backend_config["init_args"] = {"num_cpus": cpus}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # Ray's notice about accelerator variables
        flower_run_simulation(
            make_server_app(config, timeouts or Timeouts()),
            client_app,
            num_supernodes=config.clients,
            backend_config=backend_config,
        )
    status = config.run_dir() / "status.json"
    if not status.exists():
        raise RuntimeError(f"the simulation wrote no {status}; see Flower's log above")
