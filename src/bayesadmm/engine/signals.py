"""A SIGTERM as an interruption: within `sigterm_as_interrupt` a SIGTERM raises `Interrupted` (a KeyboardInterrupt),
so a run killed by `kill` or a job scheduler says so in its status, as after Ctrl-C. (Writes under
`rundir`'s guard defer the signal until the file is whole.)"""

from __future__ import annotations

import contextlib
import signal
import threading

__all__ = ["Interrupted", "sigterm_as_interrupt"]


class Interrupted(KeyboardInterrupt):
    """A signal ended the run (`signum`); the CLI exits with 128 + signum, as a shell reports it."""

    def __init__(self, signum: int):
        super().__init__(f"signal {signum}")
        self.signum = signum


@contextlib.contextmanager
def sigterm_as_interrupt():
    """Within the block a SIGTERM (what `kill` and most job schedulers send) raises KeyboardInterrupt, like Ctrl-C,
    so the run says it was interrupted; only in the main thread, where Python delivers signals."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum, frame):
        raise Interrupted(signum)

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
