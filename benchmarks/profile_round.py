"""Profile one round of many small clients (issue #6: where the per-client cost goes).

    python benchmarks/profile_round.py CLIENTS METHOD [WORKERS [SCENARIO [KEY=VALUE ...]]]   # e.g. 1000 ivon-admm 1

SCENARIO (default fmnist-heterog100) split iid into CLIENTS clients, one local epoch; rounds 1-4 untimed by the
profiler, round 5 under cProfile (top 25 by own time). KEY=VALUE: more of the scenario's settings (e.g.
data_fraction=0.01 for a quick check that the script runs, as tests/test_benchmarks.py runs it).
"""

import cProfile
import pstats
import sys
import time

import torch

from bayesadmm.engine.federation import participants
from bayesadmm.engine.pool import client_runner
from bayesadmm.experiments.build import build
from bayesadmm.experiments.config import resolve


def main():
    torch.set_num_threads(1)
    clients_n, method = int(sys.argv[1]), sys.argv[2]
    workers = int(sys.argv[3]) if len(sys.argv) > 3 else 1
    scenario = sys.argv[4] if len(sys.argv) > 4 else "fmnist-heterog100"
    overrides = [f"method={method}", f"workers={workers}", "rounds=8", f"clients={clients_n}", "partition=iid"]
    overrides += ["epochs=1", *sys.argv[5:]]
    config, _ = resolve(scenario, overrides)
    fed = build(config).federation
    alg = fed.make_algorithm()
    server = alg.init_server(fed.theta0.to(config.device))
    clients = client_runner(fed.make_algorithm, fed.clients, config.seed, workers, alg)
    ids = sorted(fed.clients.sizes)

    def one(r):
        nonlocal server
        t = time.perf_counter()
        replies = clients.train(r, alg.broadcast(server), participants(ids, config.participation, config.seed, r))
        t1 = time.perf_counter()
        server, _ = alg.server_update(server, replies)
        t2 = time.perf_counter()
        print(f"round {r}: train {t1-t:.2f} s, server {t2-t1:.2f} s", flush=True)

    try:
        clients.start(server)
        for r in range(1, 5):
            one(r)
        pr = cProfile.Profile()
        pr.enable()
        one(5)
        pr.disable()
    finally:
        clients.close()
    pstats.Stats(pr).sort_stats("tottime").print_stats(25)


if __name__ == "__main__":   # worker processes (WORKERS > 1) are spawned and import this file again
    main()
