"""flower.log: a Flower run's log in its run directory, mirrored to Flower's logger."""

from __future__ import annotations

import time
from logging import INFO
from pathlib import Path

from flwr.common.logger import log as flwr_log

from bayesadmm.engine.rundir import open_append


class RunLog:
    """flower.log in the run directory (appended to: a resume adds to it), mirrored to Flower's logger (the
    SuperLink's log / `flwr log`)."""

    def __init__(self, path: Path):
        self.path = path

    def __call__(self, text: str, level: int = INFO) -> None:
        flwr_log(level, "bayesadmm: %s", text)
        with open_append(self.path) as f:  # never through a link out of the run directory
            f.write(f"{time.strftime('%Y-%m-%d %H:%M:%S')} {text}\n".encode())
