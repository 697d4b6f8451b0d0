"""Every registry algorithm on Flower (`pip install bayesadmm[flower]`).

* `server_app.make_server_app(config)`: a ServerApp whose one generic strategy calls the algorithm's `broadcast`
  and `server_update`; `client_app.app`: a ClientApp that calls its `client_update` for the node's partition.
* `records`: Messages <-> ArrayRecords, client states <-> Context.state records, lossless and pickle-free.
* `simulation.run_simulation(config)`: the same run on Flower's Simulation Runtime.
* `demo`: a loopback deployment with TLS (one SuperLink, N SuperNodes, `flwr run`), `bayesadmm flower demo`.
* `flower_app/` (in the repository): the Flower app project `flwr run` starts.

The submodules import flwr; importing this package does not, so the rest of bayesadmm works without the extra.
"""

import os

# Flower sends usage telemetry to its servers unless FLWR_TELEMETRY_ENABLED=0, and `flwr` checks for updates online
# unless FLWR_DISABLE_UPDATE_CHECK=1. Off by default here (federated runs often happen where no outside traffic is
# wanted or possible); set them yourself before importing flwr to turn them on. Read when flwr is first imported.
os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
os.environ.setdefault("FLWR_DISABLE_UPDATE_CHECK", "1")
