"""torch's intra-op threads for a block of work (`one_thread`): the engine's client loops, the servers' stacking of
replies and the paper's toy run on one thread, where torch's threads would only wait for each other."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch

__all__ = ["one_thread"]


@contextmanager
def one_thread() -> Iterator[None]:
    """torch on one intra-op thread inside the block (the caller's setting is restored after). Entering it costs
    nothing when torch already runs on one thread; switching the count costs milliseconds (the thread pool restarts),
    so loops over clients enter it once, not per client."""
    threads = torch.get_num_threads()
    if threads == 1:
        yield
        return
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)
