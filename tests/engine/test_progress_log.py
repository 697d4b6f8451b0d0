"""A run's progress where the output is not a terminal (a file, a pipe, CI) is a log: one line per round (per N rounds
for long runs, the last always) and one when the run ends, no carriage-return animation; on a terminal, a tqdm bar.
The first round says when it compiles IVON's kernels, and how to turn that off."""

from __future__ import annotations

import io

import torch
from torch import nn

import bayesadmm
from bayesadmm.engine import history
from bayesadmm.engine import run as engine_run
from bayesadmm.optim import kernels

FEDAVG = {"lr": 0.05, "epochs": 1, "batch_size": 8}


def _run(out, rounds, **kwargs):
    gen = torch.Generator().manual_seed(0)
    clients = [(torch.randn(16, 3, generator=gen), torch.randint(0, 2, (16,), generator=gen)) for _ in range(2)]
    test = (torch.randn(20, 3, generator=gen), torch.randint(0, 2, (20,), generator=gen))
    torch.manual_seed(0)
    return bayesadmm.run(nn.Linear(3, 2), clients, test, algorithm="fedavg", hparams=FEDAVG, rounds=rounds, out=out,
                         **kwargs)  # fmt: skip


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_run_whose_stderr_is_not_a_terminal_logs_one_line_per_round_and_one_at_the_end(tmp_path, capsys):
    _run(tmp_path / "run", 3)  # pytest's captured stderr is not a terminal
    err = capsys.readouterr().err
    lines = err.splitlines()
    assert "\r" not in err
    assert [line.split("  ")[0] for line in lines] == [f"fedavg: round {r}/3" for r in (1, 2, 3)] + [lines[-1]]
    assert "acc (at mean)" in lines[0]  # a point estimate's accuracy, said to be at the mean
    assert lines[-1].startswith("fedavg: completed after round 3/3 in ")


def test_a_long_run_logs_at_most_50_round_lines_and_always_the_last_round():
    for rounds in (1, 49, 50, 51, 200, 1000, 12345):
        stream = io.StringIO()
        log = history.progress_bar(rounds, 0, True, "t", stream)
        assert isinstance(log, history.RoundLog)
        for _ in range(rounds):
            log.set_postfix_str("acc (predictive) 90.0%")
            log.update(1)
        log.close("completed")
        lines = stream.getvalue().splitlines()
        assert len(lines) - 1 <= history.LOG_LINES, rounds
        assert lines[-2].startswith(f"t: round {rounds}/{rounds}  acc (predictive) 90.0%")
        assert lines[-1].startswith(f"t: completed after round {rounds}/{rounds}")
        if rounds < history.LOG_LINES:
            assert len(lines) == rounds + 1  # a short run: every round


def test_a_resumed_run_logs_the_rounds_it_runs():
    stream = io.StringIO()
    log = history.progress_bar(5, 3, True, "t", stream)
    log.update(1)
    log.update(1)
    log.close("completed")
    assert [line.split("  ")[0] for line in stream.getvalue().splitlines()[:2]] == ["t: round 4/5", "t: round 5/5"]


def test_a_terminal_gets_the_bar_and_a_switched_off_progress_prints_nothing():
    from tqdm import tqdm

    assert isinstance(history.progress_bar(10, 0, True, "t", Terminal()), tqdm)
    quiet = io.StringIO()
    bar = history.progress_bar(10, 0, False, "t", quiet)
    bar.update(1)
    history.note(bar, "nothing")
    history.close_progress(bar, "completed")
    assert quiet.getvalue() == ""


def test_the_progress_says_whether_its_accuracy_is_the_predictives_or_at_the_mean():
    line = {"round": 1, "test_acc": 0.5, "ens_test_acc": 0.75}
    assert history.headline(line, "test") == "acc (predictive) 75.0%"
    assert history.headline({"round": 1, "test_acc": 0.5}, "test") == "acc (at mean) 50.0%"
    assert history.headline({"round": 1, "val_rmse": 0.25}, "val") == "rmse (at mean) 0.25"


def test_the_first_round_says_it_compiles_the_kernels_and_how_to_turn_that_off(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(engine_run, "compiled_kernels", lambda algorithm: True)
    monkeypatch.setattr(engine_run, "compiled_here", lambda: False)
    _run(tmp_path / "compiles", 2)
    lines = capsys.readouterr().err.splitlines()
    assert lines[0].startswith("round 1 compiles IVON's kernels first") and "compile=off" in lines[0]
    assert sum("compiles IVON's kernels" in line for line in lines) == 1
    monkeypatch.setattr(engine_run, "compiled_here", lambda: True)  # compiled in this process already: no word
    _run(tmp_path / "compiled", 2)
    assert not any("compiles" in line for line in capsys.readouterr().err.splitlines())
    monkeypatch.setattr(engine_run, "compiled_kernels", lambda algorithm: False)  # eager kernels: no word
    monkeypatch.setattr(engine_run, "compiled_here", lambda: False)
    _run(tmp_path / "eager", 2)
    assert not any("compiles" in line for line in capsys.readouterr().err.splitlines())


def test_a_kernel_counts_as_compiled_here_once_it_ran_compiled(monkeypatch):
    monkeypatch.setenv("BAYESADMM_COMPILE", "1")
    kernels.recheck_compile_enabled()
    monkeypatch.setattr(kernels, "_compiled", lambda fn, config: lambda *args: fn(*args))  # no compiler in the test
    double = kernels.fused(lambda x: 2 * x)
    assert not double.compiled_here()
    assert double(torch.ones(1)).item() == 2
    assert double.compiled_here()
    monkeypatch.setenv("BAYESADMM_COMPILE", "0")
    kernels.recheck_compile_enabled()
    eager = kernels.fused(lambda x: 2 * x)
    eager(torch.ones(1))
    assert not eager.compiled_here()


def test_the_log_the_readme_and_getting_started_show_is_the_one_a_run_prints():
    import re
    from pathlib import Path

    from bayesadmm.optim.compilation import compiling_note

    root = Path(__file__).resolve().parents[2]
    round_line = re.compile(r"ivon-admm: round (\d+)/5  acc \(predictive\) \d+\.\d%  \(\d+ s elapsed\)")
    end_line = re.compile(r"ivon-admm: completed after round 5/5 in \d+ s")
    for page in (root / "README.md", root / "docs" / "getting-started.md"):
        blocks = [b for b in re.findall(r"```text\n(.*?)```", page.read_text(), flags=re.S) if "elapsed" in b]
        assert blocks, page
        for block in blocks:
            lines = block.splitlines()
            if lines[0].startswith("round 1 compiles"):
                assert lines.pop(0) == compiling_note(1), page
            assert all(round_line.fullmatch(line) for line in lines[:-1]) and end_line.fullmatch(lines[-1]), page
    stream = io.StringIO()  # and a RoundLog writes lines of that form
    log = history.progress_bar(5, 3, True, "ivon-admm", stream)
    log.set_postfix_str(history.headline({"round": 4, "test_acc": 0.9, "ens_test_acc": 0.902}, "test"))
    log.update(1)
    log.update(1)
    log.close("completed")
    *rounds, end = stream.getvalue().splitlines()
    assert all(round_line.fullmatch(line) for line in rounds) and end_line.fullmatch(end)
