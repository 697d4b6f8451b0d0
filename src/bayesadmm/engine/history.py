"""A run's record of its rounds: the lines of metrics.jsonl (made, appended, read back up to a round) and what the
progress bar shows of them."""

from __future__ import annotations

import contextlib
import json
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from bayesadmm.engine.rundir import RunDirError, open_append, read_bytes

__all__ = [
    "metrics_line",
    "append_line",
    "read_metrics",
    "mean_client_info",
    "headline",
    "progress_bar",
    "RoundLog",
    "log_every",
    "close_progress",
    "note",
    "on_done",
]


def metrics_line(
    round_: int, results: Mapping[str, float], seconds: float, eval_seconds: float, count: int, eval_set: str = "test"
) -> dict:
    """One line of metrics.jsonl: `acc` → `test_acc`, `ens_acc` → `ens_test_acc`, then timings and participants."""
    line: dict[str, Any] = {"round": round_}
    for key, value in results.items():
        line[f"ens_{eval_set}_{key[4:]}" if key.startswith("ens_") else f"{eval_set}_{key}"] = value
    line.update({"seconds": seconds, "eval_seconds": eval_seconds, "participants": count})
    return line


def append_line(path: Path, line: Mapping[str, Any]) -> None:
    """`line` as a line of JSON at the end of `path`; a write that fails (a full disk) leaves the file as it was and
    is an OSError naming it (a file object's own says only "No space left on device"). Never through a symbolic
    link, nor into anything but a regular file (`rundir.open_append`)."""
    data = memoryview((json.dumps(line) + "\n").encode())
    with open_append(path) as f:  # unbuffered: nothing is left to fail again when the file is closed
        size = f.tell()
        try:
            while data:
                data = data[f.write(data) :]
        except OSError as exc:
            with contextlib.suppress(OSError):
                f.truncate(size)  # no torn last line
            raise OSError(exc.errno, f"could not write {path}: {exc.strerror or exc}") from exc


def read_metrics(path: Path, up_to: int) -> list[dict]:
    """The lines of metrics.jsonl (or personal.jsonl) of rounds up to `up_to` (none if there is no file); a line that
    is not a round's record (a JSON table with an integer "round") is a RunDirError naming the file and the line."""
    if not path.exists():
        return []
    try:
        text = read_bytes(path).decode()
    except UnicodeDecodeError:
        raise RunDirError(f"{path} is not text; restore it, or delete it (the rounds' metrics are lost)") from None
    lines = []
    for number, raw in enumerate(text.splitlines(), 1):
        if not raw.strip():
            continue
        try:
            line = json.loads(raw)
        except ValueError:
            line = None
        round_ = line.get("round") if isinstance(line, dict) else None
        if isinstance(round_, bool) or not isinstance(round_, int):
            raise RunDirError(
                f"{path} line {number} is not a round's metrics (a JSON table with its integer round): {raw[:60]!r}; "
                "restore the file, or remove the line"
            )
        lines.append(line)
    return [line for line in lines if line["round"] <= up_to]


def mean_client_info(infos: Mapping[int, Mapping[str, float]]) -> dict[str, float]:
    """`client_<key>`: the mean over this round's participants of each scalar their info records share."""
    if not infos:
        return {}
    keys = set.intersection(*(set(info) for info in infos.values()))
    ordered = [infos[k] for k in sorted(infos)]  # in id order: the sum must not depend on which worker replied first
    return {f"client_{key}": sum(info[key] for info in ordered) / len(ordered) for key in sorted(keys)}


def headline(line: Mapping[str, Any], eval_set: str) -> str:
    """The metric the progress shows: accuracy, else RMSE, else NLL, of the posterior predictive where there is one,
    else at the posterior's mean (a point estimate's only value), and which of the two it is."""
    for key, label, scale in (("acc", "acc", 100), ("rmse", "rmse", 1), ("nll", "nll", 1)):
        for name, of in ((f"ens_{eval_set}_{key}", "predictive"), (f"{eval_set}_{key}", "at mean")):
            if name in line:
                value = f"{scale * line[name]:.1f}%" if scale == 100 else f"{line[name]:.4g}"
                return f"{label} ({of}) {value}"
    return ""


# A log prints at most this many round lines a run (every round of a short run; every N-th and the last of a long one)
LOG_LINES = 50


def progress_bar(last_round: int, start: int, enabled: bool, title: str, stream: Any = None):
    """The rounds' progress on `stream` (default stderr): a tqdm bar where it is a terminal; where it is not (a file,
    a pipe, CI), a `RoundLog` of lines, since a bar's hundreds of carriage-return updates would fill the log; a
    disabled bar where not `enabled`."""
    from tqdm import tqdm

    stream = sys.stderr if stream is None else stream
    if enabled and not is_terminal(stream):
        return RoundLog(last_round, start, title or "rounds", stream)
    return tqdm(
        total=last_round,
        initial=start,
        desc=title or "rounds",
        unit="round",
        disable=not enabled,
        dynamic_ncols=True,
        file=stream,
    )


def is_terminal(stream: Any) -> bool:
    """Whether `stream` is a terminal (a stream without `isatty`, or a closed one, is not)."""
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError, OSError):
        return False


def log_every(last_round: int) -> int:
    """Every how many rounds a `RoundLog` prints a line: 1 up to `LOG_LINES` − 1 rounds, more for longer runs, so
    that a run prints at most `LOG_LINES` round lines (the multiples of it, and the last round)."""
    return max(1, -(-last_round // (LOG_LINES - 1)))


class RoundLog:
    """The progress of a run's rounds as lines of a log, where the output is not a terminal: one line per round (per
    `log_every` rounds for long runs, the last round always), then one when the run ends (`close`). It takes the
    calls `Run` makes of a tqdm bar (`set_postfix_str`, `update`, `write`, `close`).

        ivon-admm: round 3/10  acc (predictive) 93.1%  (4 s elapsed)
        ivon-admm: completed after round 10/10 in 12 s"""

    def __init__(self, last_round: int, start: int, title: str, stream: Any):
        self.total, self.n, self.title, self.stream = last_round, start, title, stream
        self.every = log_every(last_round)
        self.postfix = ""
        self.began = time.perf_counter()
        self.closed = False

    def set_postfix_str(self, text: str = "", refresh: bool = True) -> None:
        self.postfix = text

    def update(self, n: int = 1) -> None:
        self.n += n
        if self.n % self.every == 0 or self.n >= self.total:
            shown = f"  {self.postfix}" if self.postfix else ""
            self.write(f"{self.title}: round {self.n}/{self.total}{shown}  ({self._elapsed()} elapsed)")

    def write(self, text: str) -> None:
        """A line of its own on the log's stream."""
        print(text, file=self.stream, flush=True)

    def close(self, outcome: str = "") -> None:
        """The run's last line: how it ended (`outcome`, e.g. "completed"), after which round, in how long; once."""
        if self.closed:
            return
        self.closed = True
        self.write(f"{self.title}: {outcome or 'ended'} after round {self.n}/{self.total} in {self._elapsed()}")

    def _elapsed(self) -> str:
        return f"{time.perf_counter() - self.began:.0f} s"


def close_progress(bar: Any, outcome: str) -> None:
    """Close a run's progress (`progress_bar`'s): a log's last line says `outcome`; a tqdm bar just closes."""
    if isinstance(bar, RoundLog):
        bar.close(outcome)
    else:
        bar.close()


def note(bar: Any, text: str) -> None:
    """`text` as a line of its own in a run's progress (above a terminal's bar, which goes on below it); nothing where
    the progress is switched off."""
    if isinstance(bar, RoundLog):
        bar.write(text)
    elif not getattr(bar, "disable", True):
        bar.write(text, file=bar.fp)


def on_done(bar: Any, total: int, began: float) -> Callable[[int], None]:
    """A round's client-done callback: shows "client i/total" on the bar, at most every 0.2 s (not a terminal write
    per client: there may be thousands)."""
    finished, shown = 0, began

    def done(k: int) -> None:
        nonlocal finished, shown
        finished += 1
        if time.perf_counter() - shown > 0.2:
            bar.set_postfix_str(f"client {finished}/{total}")
            shown = time.perf_counter()

    return done
