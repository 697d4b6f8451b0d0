"""The CIFAR batch format: unpickling a batch with only numpy's array globals, and assembling the image tensor.

Unpickling can run arbitrary code, so a batch is unpickled with an unpickler
that refuses every global except the few numpy needs to rebuild an array
(:data:`_PICKLE_GLOBALS`).
"""

from __future__ import annotations

import io
import pickle
from collections.abc import Sequence

import numpy as np
import torch

IMAGE_SHAPE = (3, 32, 32)
_PIXELS = 3 * 32 * 32

#: The only globals an expected member may reference: numpy's array and
#: dtype reconstructors (old ``numpy.core`` and numpy 2's ``numpy._core``
#: spellings, protocol 2 and 5 paths) and ``_codecs.encode``, which Python 3
#: uses to pickle bytes at protocol 2.
_PICKLE_GLOBALS = frozenset(
    {
        ("numpy", "ndarray"),
        ("numpy", "dtype"),
        ("numpy.core.multiarray", "_reconstruct"),
        ("numpy._core.multiarray", "_reconstruct"),
        ("numpy.core.multiarray", "scalar"),
        ("numpy._core.multiarray", "scalar"),
        ("numpy.core.numeric", "_frombuffer"),
        ("numpy._core.numeric", "_frombuffer"),
        ("_codecs", "encode"),
    }
)


class CifarFormatError(ValueError):
    """A CIFAR file or archive was found but is not in the expected format."""


class _ArrayUnpickler(pickle.Unpickler):
    """``pickle.Unpickler(f, encoding="bytes")`` that only rebuilds numpy arrays."""

    def find_class(self, module: str, name: str):
        if (module, name) not in _PICKLE_GLOBALS:
            raise pickle.UnpicklingError(f"refusing to load global {module}.{name}")
        return super().find_class(module, name)


def _parse_member(raw: bytes, label_key: bytes, source: str) -> tuple[np.ndarray, np.ndarray]:
    """(data (N, 3072) uint8, labels (N,) int64) from one pickled batch."""
    try:
        batch = _ArrayUnpickler(io.BytesIO(raw), encoding="bytes").load()
    except Exception as exc:  # a corrupt pickle can raise almost anything
        raise CifarFormatError(f"{source}: not a readable CIFAR batch ({type(exc).__name__}: {exc})") from exc
    if not isinstance(batch, dict):
        raise CifarFormatError(f"{source}: expected a pickled dict, got {type(batch).__name__}")
    missing = [k for k in (b"data", label_key) if k not in batch]
    if missing:
        raise CifarFormatError(f"{source}: missing key(s) {missing}; has {sorted(batch)}")
    data = np.asarray(batch[b"data"])
    if data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != _PIXELS:
        raise CifarFormatError(f"{source}: expected uint8 data of shape (N, {_PIXELS}), got {data.dtype} {data.shape}")
    try:
        labels = np.asarray(batch[label_key], dtype=np.int64)
    except (TypeError, ValueError, OverflowError) as exc:
        raise CifarFormatError(f"{source}: labels are not integers ({exc})") from exc
    if labels.shape != (data.shape[0],):
        raise CifarFormatError(f"{source}: {data.shape[0]} images but labels of shape {labels.shape}")
    return data, labels


def _combine(parts: Sequence[tuple[np.ndarray, np.ndarray]], num_classes: int, source: str):
    data = np.concatenate([d for d, _ in parts])
    labels = np.concatenate([y for _, y in parts])
    if labels.size and (labels.min() < 0 or labels.max() >= num_classes):
        raise CifarFormatError(f"{source}: labels outside [0, {num_classes}): min {labels.min()}, max {labels.max()}")
    images = torch.from_numpy(np.ascontiguousarray(data).reshape(-1, *IMAGE_SHAPE))
    return images, torch.from_numpy(labels)


def _member_name(name: str) -> str:
    """Archive member names without a leading ``./`` (some tar tools add one)."""
    return name[2:] if name.startswith("./") else name
