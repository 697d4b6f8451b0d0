"""Worker processes: how one is started (its arguments pickled in the parent, with the fix where they do not pickle)
and how its allocator is set for many small short-lived tensors."""

from __future__ import annotations

import ctypes

__all__ = ["keep_freed_memory", "start_worker"]


def keep_freed_memory() -> None:
    """Have glibc keep the memory freed at the top of the heap rather than return it to the OS at once.

    A worker frees each client's temporaries and its reply as soon as the client is done, so the top of its heap is
    free between clients and glibc trims it; every allocation there then faults its pages in again (~400 page faults
    per FedAvg client of the papers' MLP, ~0.5 ms, a fifth of the update). The worker's memory instead stays at its
    high-water mark. A no-op where malloc is not glibc's (mallopt missing, or ignoring these settings).
    """
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return
    mallopt(-1, 1 << 30)  # M_TRIM_THRESHOLD: trim only above 1 GiB of free memory at the top
    mallopt(-3, 32 << 20)  # M_MMAP_THRESHOLD: blocks below 32 MiB (the maximum) from the heap, where they are reused


def start_worker(process) -> None:
    """Start a worker; its arguments (the algorithm's factory, the client source) are pickled here, in the parent, so
    an object that does not pickle fails now, with the fix."""
    import pickle

    try:
        process.start()
    except (pickle.PicklingError, AttributeError, TypeError) as exc:
        raise ValueError(
            f"the algorithm's factory and the clients must pickle to run in worker processes "
            f"(workers > 1), and they do not ({exc}): make them module-level functions, "
            f"functools.partials of them, or dataclasses of tensors; or use workers=1"
        ) from exc
