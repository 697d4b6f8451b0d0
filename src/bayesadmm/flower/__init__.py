"""Any bayesadmm algorithm on Flower (`pip install bayesadmm[flower]`), each SuperNode training on its own data.

* `strategy(method, model=..., **hparams)` / `strategy_from_config(context.run_config, model=...)`: every registry
  method as a Flower strategy (`BayesStrategy`) that your own ServerApp starts, and `client`: what your own
  ClientApp's query, train and evaluate functions call with your model and the node's data;
* `server_app.app`: the ServerApp of the run-config apps (presets, a model named in the run config): the same strategy
  built from `flwr run`'s run config; `client_app.app`: a ClientApp that runs `client_update` for the node's
  client on its own data (`loaders`: ``data=PATH`` or ``loader=module:function`` in the node config);
* `app_config`: the run config of `flwr run` → the engine's Settings and Federation, and the setup nodes build from;
* `records`: Messages and client states (your own NamedTuples/dataclasses too) <-> records, lossless, no pickle;
* `simulation.run_simulation(config)`: a preset on Flower's Simulation Runtime;
* `demo`: loopback deployments with TLS (`bayesadmm flower demo`, `run_deployment`); `resume`: `flwr run` with
  ``resume=true`` (`bayesadmm flower resume`);
* `preset.preset_app()`: the presets' Flower app, shipped in the package (bayesadmm/flower/app/; `flower_app/` in
  the repository); `examples/flower/` (in the repository): the app of your own model.

The submodules import flwr; importing this package does not, so the rest of bayesadmm works without the extra.
"""

import os

# Flower sends usage telemetry to its servers unless FLWR_TELEMETRY_ENABLED=0, and `flwr` checks for updates online
# unless FLWR_DISABLE_UPDATE_CHECK=1. Off by default here (federated runs often happen where no outside traffic is
# wanted or possible); set them yourself before importing flwr to turn them on. Read when flwr is first imported.
os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
os.environ.setdefault("FLWR_DISABLE_UPDATE_CHECK", "1")

__all__ = ["strategy", "strategy_from_config", "BayesStrategy", "client"]


def __getattr__(name: str):  # the strategies import flwr: only when asked for
    if name in ("strategy", "strategy_from_config"):
        from bayesadmm.flower import strategies  # optional: flwr

        return getattr(strategies, name)
    if name == "BayesStrategy":
        from bayesadmm.flower.bayes_strategy import BayesStrategy  # optional: flwr

        return BayesStrategy
    if name == "client":
        import importlib

        return importlib.import_module("bayesadmm.flower.client")
    raise AttributeError(f"module 'bayesadmm.flower' has no attribute {name!r}")
