"""Profile one round of many small clients (issue #6: where the per-client cost goes).

    python benchmarks/profile_round.py CLIENTS METHOD [WORKERS [SCENARIO]]     # e.g. 1000 ivon-admm 1

SCENARIO (default fmnist-heterog100) split iid into CLIENTS clients, one local epoch; rounds 1-4 untimed by the profiler, round 5 under cProfile (top 25 by own time).
"""
import cProfile, pstats, sys, time, torch
torch.set_num_threads(1)
from bayesadmm.engine.runner import build, participants
from bayesadmm.engine.workers import client_runner
from bayesadmm.experiments.config import resolve
clients_n = int(sys.argv[1]); method = sys.argv[2]; workers = int(sys.argv[3]) if len(sys.argv) > 3 else 1
scenario = sys.argv[4] if len(sys.argv) > 4 else "fmnist-heterog100"
config, _ = resolve(scenario, [f"method={method}", f"workers={workers}", "rounds=8", f"clients={clients_n}", "partition=iid", "epochs=1"])
exp = build(config); alg = exp.algorithm
server = alg.init_server(exp.theta0)
clients = client_runner(config, exp, workers)
clients.start(server)
def one(r):
    global server
    t = time.perf_counter()
    replies = clients.train(r, alg.broadcast(server), participants(config, r))
    t1 = time.perf_counter()
    server, _ = alg.server_update(server, replies)
    t2 = time.perf_counter()
    print(f"round {r}: train {t1-t:.2f} s, server {t2-t1:.2f} s", flush=True)
for r in range(1, 5):
    one(r)
pr = cProfile.Profile(); pr.enable()
one(5)
pr.disable()
clients.close()
pstats.Stats(pr).sort_stats("tottime").print_stats(25)
