"""The run workflow: config resolution, exact resume after a kill, partial participation, divergence, compare."""

import json
import os
import signal
import time
from pathlib import Path

import pytest
import torch

from bayesadmm.cli import main
from bayesadmm.engine import federation, signals
from bayesadmm.engine import run as engine_run
from bayesadmm.engine.rundir import load_state
from bayesadmm.experiments.build import build, run
from bayesadmm.experiments.config import ConfigError, resolve
from conftest import needs_fmnist

# a small, fast version of the heterogeneous FashionMNIST scenario
SMALL = ["data_fraction=0.01", "clients=3", "epochs=1", "eval_samples=4"]


def _lines(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def _strip_times(lines):
    return [{k: v for k, v in line.items() if k not in ("seconds", "eval_seconds")} for line in lines]


# --- configuration ---------------------------------------------------------------------------------------------------


def test_preset_and_overrides_resolve_with_types():
    config, changed = resolve("fmnist-heterog10", ["method=fedavg", "rounds=7", "lr=0.01", "epochs=2"])
    assert (config.method, config.rounds, config.clients, config.data_fraction) == ("fedavg", 7, 10, 0.1)
    assert config.hparams["lr"] == 0.01 and config.hparams["epochs"] == 2 and isinstance(config.hparams["epochs"], int)
    assert changed == ["method=fedavg", "rounds=7", "lr=0.01", "epochs=2"]
    ivon, _ = resolve("fmnist-heterog10", [])
    assert ivon.method == "ivon-admm" and ivon.hparams["gamma"] == 2e-4 and ivon.hparams["cosine"] is True
    # the FashionMNIST presets start rounds after the first at q_g (docs/results); Alg. 2 as written stays one key away
    assert ivon.hparams["restart_at_q_g"] is True
    as_written, _ = resolve("fmnist-heterog10", ["restart_at_q_g=false"])
    assert as_written.hparams["restart_at_q_g"] is False
    pvi, _ = resolve("fmnist-homog10", ["method=ivon-pvi"])   # IVON-ADMM's special case runs the same solver
    assert pvi.hparams["restart_at_q_g"] is True


def test_unknown_keys_and_wrong_types_are_errors_that_list_valid_keys():
    with pytest.raises(ConfigError, match="valid keys: .*rounds.*ivon-admm hyperparameters: .*gamma"):
        resolve("fmnist-heterog10", ["gama=0.1"])
    with pytest.raises(ConfigError, match="rounds must be int"):
        resolve("fmnist-heterog10", ["rounds=ten"])
    with pytest.raises(ConfigError, match="unknown method"):
        resolve("fmnist-heterog10", ["method=fedmagic"])
    with pytest.raises(ConfigError, match="neither a scenario"):
        resolve("no-such-scenario", [])


def test_config_file_and_command_line_precedence(tmp_path):
    path = tmp_path / "exp.json"
    path.write_text(json.dumps({"dataset": "fashion-mnist", "method": "fedavg", "rounds": 3,
                                "hparams": {"lr": 0.002, "epochs": 1}}))
    config, _ = resolve(str(path), ["rounds=5"])
    assert config.rounds == 5 and config.hparams["lr"] == 0.002 and config.scenario == "exp"
    path.write_text(json.dumps({"rounds": 3, "colour": "blue"}))
    with pytest.raises(ConfigError, match="unknown key 'colour'"):
        resolve(str(path), [])


# --- runs ------------------------------------------------------------------------------------------------------------


@needs_fmnist
def test_run_writes_its_files_and_resume_after_a_kill_is_exact(tmp_path, monkeypatch):
    args = SMALL + ["rounds=3", "method=ivon-admm", "cosine=true"]
    full = tmp_path / "full"
    assert main(["run", "fmnist-heterog10", *args, f"out={full}", "--quiet"]) == 0
    for name in ("config.json", "metrics.jsonl", "checkpoint.pt", "status.json", "curves.png", "labels.png",
                 "partition.json"):
        assert (full / name).exists(), name
    lines = _lines(full)
    assert [line["round"] for line in lines] == [1, 2, 3]
    assert {"test_acc", "test_nll", "test_ece", "ens_test_acc", "ens_test_nll", "ens_test_ece", "seconds"} <= set(lines[0])
    assert json.loads((full / "status.json").read_text())["status"] == "completed"

    # kill the process after round 2's metrics line but before its checkpoint: resume must redo round 2
    killed = tmp_path / "killed"
    save = engine_run.save_checkpoint

    def dying_save(path, round_, server, clients, identity):
        if round_ == 2:
            raise KeyboardInterrupt
        save(path, round_, server, clients, identity)

    monkeypatch.setattr(engine_run, "save_checkpoint", dying_save)
    assert main(["run", "fmnist-heterog10", *args, f"out={killed}", "--quiet"]) == 130  # as a shell reports Ctrl-C
    monkeypatch.setattr(engine_run, "save_checkpoint", save)
    assert [line["round"] for line in _lines(killed)] == [1, 2]
    status = json.loads((killed / "status.json").read_text())
    assert status["status"] == "interrupted" and status["round"] == 1 and "resume" in status["message"]
    assert main(["resume", str(killed), "--quiet"]) == 0
    assert _strip_times(_lines(killed)) == _strip_times(lines)
    # each start and resume leaves a record of what computed it: the resume continues from round 1's checkpoint
    records = json.loads((killed / "environment.json").read_text())
    assert [r["from_round"] for r in records] == [0, 1]
    assert records[0]["torch"] == torch.__version__ and records[0]["processor"] and records[0]["device"] == "cpu"


def test_a_sigterm_interrupts_like_ctrl_c_and_the_handler_is_restored():
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(KeyboardInterrupt):
        with signals.sigterm_as_interrupt():
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)   # the handler runs at the next bytecode; never reached
    assert signal.getsignal(signal.SIGTERM) is before


@needs_fmnist
def test_the_final_status_is_written_after_the_plot_and_a_failing_plot_does_not_lose_it(tmp_path, monkeypatch):
    """The final status.json is the signal that the run directory is complete (the Flower demo stops its processes on
    it): curves.png must exist by then, and a plot that fails must not keep the status from being written."""
    seen = []
    write = engine_run.write_json

    def recording_write(path, payload):
        if path.name == "status.json" and payload["status"] == "completed":
            seen.append((path.parent / "curves.png").exists())
        write(path, payload)

    monkeypatch.setattr(engine_run, "write_json", recording_write)
    assert main(["run", "fmnist-heterog10", *SMALL, "rounds=1", "method=fedavg", f"out={tmp_path / 'a'}",
                 "--quiet"]) == 0
    assert seen == [True]

    import bayesadmm.evaluation.diagrams as diagrams

    def broken_plot(history, path, title=""):
        raise RuntimeError("no backend")

    monkeypatch.setattr(diagrams, "plot_run", broken_plot)
    assert main(["run", "fmnist-heterog10", *SMALL, "rounds=1", "method=fedavg", f"out={tmp_path / 'b'}",
                 "--quiet"]) == 0
    assert json.loads((tmp_path / "b" / "status.json").read_text())["status"] == "completed"
    assert not (tmp_path / "b" / "curves.png").exists()


@needs_fmnist
def test_partial_participation_and_absent_clients(tmp_path):
    out = tmp_path / "partial"
    assert main(["run", "fmnist-heterog10", *SMALL, "clients=4", "participation=0.5", "rounds=2", "method=ivon-admm",
                 f"out={out}", "--quiet"]) == 0
    lines = _lines(out)
    assert [line["participants"] for line in lines] == [2, 2]
    config, _ = resolve("fmnist-heterog10", [*SMALL, "clients=4", "participation=0.5", "rounds=2"])
    chosen = [federation.participants(list(range(config.clients)), config.participation, config.seed, r) for r in (1, 2)]
    assert all(len(c) == 2 for c in chosen)
    checkpoint = load_state(out / "checkpoint.pt")
    # the server remembers every client that has ever replied, not only this round's
    assert set(checkpoint["server"].replies) == set(chosen[0]) | set(chosen[1])


@needs_fmnist
def test_divergence_stops_with_the_state_saved(tmp_path, monkeypatch):
    """A client whose loss turns NaN in round 2: the run stops with status 'diverged', exit code 3, and the state
    of round 1 in the checkpoint."""
    from bayesadmm.problems.neural import ClassificationData

    after_round_1 = {"yes": False}
    batch_loss, batch_grad, save = ClassificationData.batch_loss, ClassificationData.batch_grad, engine_run.save_checkpoint

    def poisoned(self, theta, idx):
        loss = batch_loss(self, theta, idx)
        return loss * float("nan") if after_round_1["yes"] else loss

    def poisoned_grad(self, theta, idx):  # the per-client solvers' gradient
        grad = batch_grad(self, theta, idx)
        return grad * float("nan") if after_round_1["yes"] else grad

    def save_and_flag(path, round_, server, clients, identity):
        save(path, round_, server, clients, identity)
        after_round_1["yes"] = round_ >= 1

    monkeypatch.setattr(ClassificationData, "batch_loss", poisoned)
    monkeypatch.setattr(ClassificationData, "batch_grad", poisoned_grad)
    monkeypatch.setattr(engine_run, "save_checkpoint", save_and_flag)
    out = tmp_path / "diverged"
    # cohort=1: the per-client path, whose batch_loss and batch_grad are poisoned (a cohort's breakdown: test_cohort.py)
    code = main(["run", "fmnist-heterog10", *SMALL, "rounds=3", "method=fedavg", "cohort=1", f"out={out}", "--quiet"])
    assert code == federation.EXIT_DIVERGED
    status = json.loads((out / "status.json").read_text())
    assert status["status"] == "diverged" and status["round"] == 1 and "round 2" in status["message"]
    assert load_state(out / "checkpoint.pt")["round"] == 1
    assert [line["round"] for line in _lines(out)] == [1]


# --- compare ---------------------------------------------------------------------------------------------------------


def _fake_run(directory: Path, method: str, seed: int, accs: list[float], ens: bool,
              seconds: list[float] | None = None):
    directory.mkdir(parents=True)
    (directory / "config.json").write_text(json.dumps({"method": method, "seed": seed, "scenario": "toy"}))
    lines = []
    for r, acc in enumerate(accs, start=1):
        line = {"round": r, "test_acc": acc, "test_nll": 1.0 - acc, "test_ece": acc / 2}
        if seconds is not None:
            line["seconds"] = seconds[r - 1]
        if ens:
            line.update({"ens_test_acc": acc + 0.01, "ens_test_nll": 0.9 - acc})
        lines.append(json.dumps(line))
    (directory / "metrics.jsonl").write_text("\n".join(lines) + "\n")


def test_compare_table_uses_mean_of_last_three_rounds_over_seeds(tmp_path, capsys):
    # seconds per round: round 1 (compiling) is left out, then the median of each run, then the median over runs
    _fake_run(tmp_path / "a0", "ivon-admm", 0, [0.1, 0.2, 0.3, 0.4, 0.5], ens=True, seconds=[9, 2, 1, 2, 3])
    _fake_run(tmp_path / "a1", "ivon-admm", 1, [0.1, 0.2, 0.5, 0.6, 0.7], ens=True, seconds=[9, 4, 4, 5, 3])
    _fake_run(tmp_path / "b0", "fedavg", 0, [0.1, 0.1, 0.1, 0.1, 0.1], ens=False)
    out = tmp_path / "cmp"
    assert main(["compare", str(tmp_path / "a0"), str(tmp_path / "a1"), str(tmp_path / "b0"), "--rounds", "3,5",
                 "--out", str(out)]) == 0
    table = (out / "table.md").read_text()
    # round 3: the runs average 20 % and 26.7 % over rounds 1–3; round 5: 40 % and 60 % over rounds 3–5
    # columns: accuracy, NLL, ECE at round 3, then at round 5 (ECE = acc / 2 in these runs; none for the predictive)
    assert ("| ivon-admm (m_g) | 2 | 23.3 ± 4.7 | 0.767 ± 0.047 | 0.117 ± 0.024 | 50.0 ± 14.1 | 0.500 ± 0.141 | "
            "0.250 ± 0.071 | 3.0 |") in table
    assert table.splitlines()[0].endswith("| s/round |")
    assert next(line for line in table.splitlines() if line.startswith("| fedavg")).endswith("| — |")
    assert "| fedavg (m_g) | 1 | 10.0 | 0.900 | 0.050 | 10.0 | 0.900 |" in table   # one run: its value, no "± 0"
    assert "| ivon-admm (predictive) | 2 | 24.3 ± 4.7 | 0.667 ± 0.047 | — |" in table
    assert "ivon-admm (predictive)" in table and "fedavg (predictive)" not in table
    assert (out / "table.tex").read_text().startswith(r"\begin{tabular}")
    assert (out / "curves.png").stat().st_size > 10_000
    assert "50.0 ± 14.1" in capsys.readouterr().out


def test_compare_sets_our_numbers_beside_the_papers(tmp_path, capsys):
    """--paper adds a table of 'ours / paper (difference)' for the rows the paper reports, read from
    the scenario files' reference rows: IVON-ADMM's predictive row against the paper's IVON-ADMM (ensemble), its m_g row
    against IVON-ADMM@m_g, and methods the paper does not report (FedEP) left out."""
    from bayesadmm.evaluation.reports import paper_numbers

    published = paper_numbers("fmnist-heterog10")
    _fake_run(tmp_path / "a0", "ivon-admm", 0, [0.80, 0.81, 0.82, 0.83, 0.84], ens=True)
    _fake_run(tmp_path / "b0", "fedep", 0, [0.5] * 5, ens=False)
    out = tmp_path / "cmp"
    assert main(["compare", str(tmp_path / "a0"), str(tmp_path / "b0"), "--rounds", "3,5", "--paper",
                 "fmnist-heterog10", "--out", str(out)]) == 0
    beside = (out / "paper.md").read_text()
    assert beside in capsys.readouterr().out
    # the paper has no rounds 3 and 5 (—); our predictive accuracy at round 5 is the mean of 83, 84, 85 %
    row = next(line for line in beside.splitlines() if line.startswith("| ivon-admm (predictive)"))
    assert "| 84.0 / — |" in row
    assert "fedep" not in beside
    # a round the paper reports: 10 rounds of constant accuracy against the paper's value at round 10
    _fake_run(tmp_path / "c0", "fedavg", 0, [0.75] * 10, ens=False)
    assert main(["compare", str(tmp_path / "c0"), "--rounds", "10", "--paper", "fmnist-heterog10"]) == 0
    paper_acc, paper_nll = published["fedavg"]["acc"]["10"], published["fedavg"]["nll"]["10"]
    expected = (f"| fedavg (m_g) | 1 | 75.0 / {paper_acc:.1f} ({75.0 - paper_acc:+.1f}) | "
                f"0.250 / {paper_nll:.2f} ({0.25 - paper_nll:+.3f}) |")
    assert expected in capsys.readouterr().out
    assert main(["compare", str(tmp_path / "c0"), "--paper", "cifar-nothing"]) == 2


def test_compare_and_resume_errors(tmp_path):
    assert main(["compare", str(tmp_path / "missing")]) == 2
    assert main(["resume", str(tmp_path)]) == 2


# What this FashionMNIST test sets beyond the scenario's presets: the methods without a preset for it (their specs'
# `example`s are for the toy problems, not this data), a shorter FedLap-Func server and the other FedLap-Cov curvature.
FMNIST_EXTRAS = {"ama": ["rho=0.01", "delta=1.0", "lr=1e-3", "batch_size=32"],
                 "bayes-admm-iso": ["rho=0.1", "delta=1.0", "precision=1e4", "lr=1e-3", "batch_size=32"],
                 "fedlap-func": ["server_iterations=50"], "fedlap-cov": ["curvature=mc-fisher"]}


def test_every_method_without_a_preset_has_settings_here():
    from bayesadmm.algorithms import specs
    from bayesadmm.experiments.scenario_data import presets_of

    builtin = [s for s in specs() if s.build.__module__.startswith("bayesadmm.")]  # (other tests register their own)
    assert {s.name for s in builtin if "fmnist-heterog10" not in presets_of(s)} <= set(FMNIST_EXTRAS)


@needs_fmnist
@pytest.mark.parametrize("method", __import__("bayesadmm.algorithms", fromlist=["names"]).names())
def test_every_registered_method_runs_and_learns(tmp_path, method):
    """Every method in the registry runs through the engine on a small FashionMNIST slice, its metrics are finite,
    and the test NLL at the server mean after 3 rounds is below the NLL of chance (log 10 ≈ 2.303) — except AMA,
    which without a server proximal term needs step sizes tuned to the problem (Tseng 1991) and is only run here."""
    out = tmp_path / method
    assert main(["run", "fmnist-heterog10", f"method={method}", "data_fraction=0.02", "clients=3", "epochs=2",
                 "rounds=3", "eval_samples=4", f"out={out}", "--quiet", *FMNIST_EXTRAS.get(method, [])]) == 0
    last = _lines(out)[-1]
    assert all(v == v for v in last.values())                      # no NaN
    if method != "ama":
        assert last["test_nll"] < 2.30


# --- parallel workers ------------------------------------------------------------------------------------------------


@needs_fmnist
@pytest.mark.parametrize(("method", "cohort", "partial"), [
    ("fedavg", 1, []), ("ivon-admm", 1, []), ("ivon-admm", 2, []),
    ("fedavg", 2, ["clients=8", "participation=0.5"]),  # blocks of 4 clients, a round's participants in cohorts
])
def test_two_workers_give_exactly_the_numbers_of_one(tmp_path, method, cohort, partial):
    """Client updates in worker processes: same generator, same data layout, one thread each, so the same bits; with
    a cohort size set, each worker trains whole blocks of the run (`policy.cohort_blocks`), and a round's cohorts are
    made within a block, so the same bits again, at partial participation too."""
    lines = {}
    for workers in (1, 2):
        config, _ = resolve("fmnist-heterog10", SMALL + partial + [f"method={method}", "rounds=2", f"workers={workers}",
                                                                   f"cohort={cohort}", f"out={tmp_path / str(workers)}"])
        assert run(config, progress=False).exit_code == federation.EXIT_OK
        lines[workers] = _strip_times(_lines(tmp_path / str(workers)))
    assert len(lines[1]) == 2 and lines[1] == lines[2]


def test_workers_must_not_be_negative():
    with pytest.raises(ConfigError, match=r"workers must be an integer >= 0 \(0: one per core"):
        resolve("fmnist-heterog10", ["workers=-1"])


def test_a_device_this_machine_lacks_is_a_clear_error_before_anything_is_written(tmp_path, monkeypatch, capsys):
    with pytest.raises(ConfigError, match="must be a torch device"):
        resolve("fmnist-heterog10", ["device=gpu"])
    with pytest.raises(ConfigError, match="only cpu, cuda and mps"):
        resolve("fmnist-heterog10", ["device=meta"])
    assert resolve("fmnist-heterog10", ["device=cpu"])[0].device == "cpu"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ConfigError, match="sees no CUDA device"):
        resolve("fmnist-heterog10", ["device=cuda"])
    out = tmp_path / "run"
    assert main(["run", "fmnist-heterog10", "device=cuda:0", f"out={out}", "--quiet"]) == 2
    assert "sees no CUDA device" in capsys.readouterr().err and not out.exists()
    # a run made on a GPU machine, resumed on one without
    out.mkdir()
    (out / "checkpoint.pt").write_bytes(b"")
    config, _ = resolve("fmnist-heterog10", [f"out={out}"])
    (out / "config.json").write_text(json.dumps({**config.to_json(), "device": "cuda"}))
    assert main(["resume", str(out)]) == 2
    assert "cannot resume here" in capsys.readouterr().err
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(ConfigError, match="has 1 CUDA device"):
        resolve("fmnist-heterog10", ["device=cuda:1"])
    assert resolve("fmnist-heterog10", ["device=cuda"])[0].device == "cuda"   # accepted where CUDA is present


@needs_fmnist
def test_validation_split_is_held_out_of_training_and_reported_as_val(tmp_path):
    """validation=f evaluates on a held-out part of the training set (for choosing hyperparameters), never on test."""
    out = tmp_path / "val"
    config, _ = resolve("fmnist-heterog10", SMALL + ["method=fedavg", "rounds=1", "validation=0.2", f"out={out}"])
    held = build(config).federation
    full = build(resolve("fmnist-heterog10", SMALL + ["method=fedavg"])[0]).federation
    assert len(held.eval_y) == round(0.2 * len(full.clients.y))                # taken from training, not test
    assert len(held.clients.y) + len(held.eval_y) == len(full.clients.y)
    assert run(config, progress=False).exit_code == federation.EXIT_OK
    (line,) = _lines(out)
    assert "val_acc" in line and not any(key.startswith("test_") for key in line)
    table = main(["compare", str(out), "--rounds", "1", "--out", str(tmp_path / "cmp")])
    written = (tmp_path / "cmp" / "table.md").read_text()
    assert table == 0 and "ECE" in written and written.startswith("| method (validation split) |")
    with pytest.raises(ConfigError, match="validation must be in"):
        resolve("fmnist-heterog10", ["validation=1.0"])


@needs_fmnist
def test_stop_at_then_resume_gives_the_uninterrupted_run(tmp_path):
    """stop_at splits a long run into parts: the schedule (cosine lr) still spans `rounds`."""
    whole, split = tmp_path / "whole", tmp_path / "split"
    common = ["fmnist-heterog10", *SMALL, "method=ivon-admm", "rounds=3", "--quiet"]
    assert main(["run", *common, f"out={whole}"]) == 0
    assert main(["run", *common, "stop_at=1", f"out={split}"]) == 0
    assert json.loads((split / "status.json").read_text())["status"] == "stopped"
    assert len(_lines(split)) == 1
    assert main(["resume", str(split), "--quiet"]) == 0
    assert json.loads((split / "status.json").read_text())["status"] == "completed"
    assert _strip_times(_lines(split)) == _strip_times(_lines(whole))
    with pytest.raises(ConfigError, match="stop_at must be in"):
        resolve("fmnist-heterog10", ["rounds=3", "stop_at=4"])


@needs_fmnist
def test_fedep_family_inference_choices_run_and_compare(tmp_path):
    """`bayesadmm run` takes FedEP's tilted-inference choice and its settings as overrides, and `compare` tables the
    runs (the registry test above covers each method with its default inference)."""
    runs = {"fedep-mcmc": ["method=fedep", "inference=mcmc", "shrinkage=1e-3"],
            "fedsep-ngvi": ["method=fedsep", "inference=ngvi", "ngvi_beta=0.9"],
            "fedpa-laplace": ["method=fedpa", "inference=laplace"]}
    for tag, args in runs.items():
        out = tmp_path / tag
        assert main(["run", "fmnist-heterog10", *args, "data_fraction=0.01", "clients=2", "epochs=1", "rounds=2",
                     "eval_samples=2", f"out={out}", "--quiet"]) == 0
        config = json.loads((out / "config.json").read_text())
        assert config["hparams"]["inference"] == args[1].split("=")[1]
        last = _lines(out)[-1]
        assert last["round"] == 2 and all(v == v for v in last.values())
    assert main(["compare", *(str(tmp_path / tag) for tag in runs), "--rounds", "2", "--out", str(tmp_path / "cmp")]) == 0
    table = (tmp_path / "cmp" / "table.md").read_text()
    assert all(f"| {tag} (m_g) |" in table for tag in runs)       # method and inference name the row


def test_compare_keeps_runs_with_different_inference_apart(tmp_path):
    """FedEP with scaled-identity and with NGVI inference are different methods in a table, not two seeds."""
    for name, inference, acc in (("i", "identity", 0.5), ("v", "ngvi", 0.7)):
        _fake_run(tmp_path / name, "fedep", 0, [acc] * 3, ens=False)
        config = json.loads((tmp_path / name / "config.json").read_text())
        config["hparams"] = {"inference": inference}
        (tmp_path / name / "config.json").write_text(json.dumps(config))
    assert main(["compare", str(tmp_path / "i"), str(tmp_path / "v"), "--rounds", "3",
                 "--out", str(tmp_path / "cmp")]) == 0
    table = (tmp_path / "cmp" / "table.md").read_text()
    assert "| fedep-identity (m_g) | 1 | 50.0 |" in table and "| fedep-ngvi (m_g) | 1 | 70.0 |" in table


def test_compare_keeps_runs_with_different_settings_apart_and_seeds_together(tmp_path):
    """Runs of one method whose hyperparameters differ are separate rows named by the differing settings (a δ × τ_f
    grid is not three seeds); seeds of one setting share a row; such a row is still set beside the paper's method."""
    def run(name, seed, acc, hparams):
        _fake_run(tmp_path / name, "fedlap-func", seed, [acc] * 3, ens=False)
        config = json.loads((tmp_path / name / "config.json").read_text())
        config["hparams"] = hparams
        (tmp_path / name / "config.json").write_text(json.dumps(config))
        return str(tmp_path / name)

    dirs = [run("a0", 0, 0.5, {"delta": 0.01, "tau_f": 1e-4, "lr": 1e-3}),
            run("a1", 1, 0.7, {"delta": 0.01, "tau_f": 1e-4, "lr": 1e-3}),
            run("b0", 0, 0.8, {"delta": 1.0, "tau_f": 1e-4, "lr": 1e-3})]
    out = tmp_path / "cmp"
    assert main(["compare", *dirs, "--rounds", "3", "--paper", "fmnist-heterog10", "--out", str(out)]) == 0
    table = (out / "table.md").read_text()
    assert "| fedlap-func [delta=0.01] (m_g) | 2 | 60.0 ± 14.1 |" in table
    assert "| fedlap-func [delta=1.0] (m_g) | 1 | 80.0 |" in table
    beside = (out / "paper.md").read_text()
    assert "| fedlap-func [delta=1.0] (m_g) | 1 |" in beside and "| fedlap-func [delta=0.01] (m_g) | 2 |" in beside
    # the same settings everywhere: the plain method name, as before
    assert main(["compare", dirs[0], dirs[1], "--rounds", "3", "--out", str(tmp_path / "same")]) == 0
    assert "| fedlap-func (m_g) | 2 | 60.0 ± 14.1 |" in (tmp_path / "same" / "table.md").read_text()
