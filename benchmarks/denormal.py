"""Client-update time with and without flushing denormal floats to zero (torch.set_flush_denormal).

    python benchmarks/denormal.py METHOD 0|1 [KEY=VALUE ...]
    # e.g. fedavg 1 clients=1000 data_fraction=1.0 partition=iid epochs=1

Trains the first 50 clients of fmnist-heterog10 (with the overrides) for 3 rounds on one thread; prints round 3.
"""

import sys
import time

import torch

from bayesadmm.engine.runners import train_client
from bayesadmm.experiments.build import build
from bayesadmm.experiments.config import resolve

torch.set_num_threads(1)
method, flush, *over = sys.argv[1:]
torch.set_flush_denormal(flush == "1")
config, _ = resolve("fmnist-heterog10", [f"method={method}", "workers=1", *over])
fed = build(config).federation
alg = fed.make_algorithm()
server = alg.init_server(fed.theta0.to(config.device))
ks = sorted(fed.clients.sizes)[:50]
data = {k: fed.clients(k) for k in ks}
states = {k: alg.init_client(server, k) for k in ks}
for r in (1, 2, 3):
    msg = alg.broadcast(server)
    t = time.perf_counter()
    replies = {}
    for k in ks:
        states[k], replies[k], _ = train_client(alg, states[k], msg, data[k], 0, r, k)
    dt = time.perf_counter() - t
    server, _ = alg.server_update(server, replies)
    print(method, "flush" if flush == "1" else "keep", r, f"{dt:.2f} s", flush=True)
