"""The posterior file: one `.safetensors` file holding a trained posterior's tensors and a JSON header, checksummed.

The file is safetensors (tensors and string metadata, nothing executable; https://huggingface.co/docs/safetensors).
Its metadata has four keys:

    format   "bayesadmm-posterior"
    version  "1"
    header   JSON text: family, tensors, dim, dtype, layout, precision (isotropic only), provenance
    sha256   hex sha256 of format, version and header as stored, then of each tensor named in header["tensors"],
             in that order (its dtype, shape and raw bytes, `trees.hash_tensors`)

The tensors are the natural parameters of the Gaussian (`natural.0`, `natural.1`; the family's own tuple, so a
round trip is exact to the bit) or, for a point estimate, `mean`. `decode` checks everything before anything is
built: the format and version, the checksum, the tensors against the family and the layout, finite values, and the
Gaussian itself (`family.validate`: a positive precision). Every problem is a `PosteriorFileError` (a ValueError) of
one or two lines saying what is wrong and what to do.
"""

from __future__ import annotations

import hashlib
import json
import math
import struct
from collections.abc import Mapping
from typing import Any, NamedTuple

import torch
from safetensors import SafetensorError
from safetensors.torch import load as load_tensors
from safetensors.torch import save as save_tensors
from torch import Tensor

from bayesadmm.trees import hash_tensors

__all__ = ["FORMAT", "VERSION", "FAMILIES", "PosteriorFileError", "Contents", "encode", "decode"]

FORMAT, VERSION = "bayesadmm-posterior", "1"
# family -> the tensors it stores
FAMILIES: dict[str, tuple[str, ...]] = {
    "isotropic": ("natural.0",),
    "diagonal": ("natural.0", "natural.1"),
    "full": ("natural.0", "natural.1"),
    "point": ("mean",),
}
DTYPES = {"float32": torch.float32, "float64": torch.float64}
Layout = tuple[tuple[str, tuple[int, ...]], ...]


class PosteriorFileError(ValueError):
    """A file that is not a valid bayesadmm posterior file (foreign, truncated, tampered with or inconsistent)."""


class Contents(NamedTuple):
    """What a posterior file holds: its decoded JSON header and its tensors by name."""

    header: dict
    tensors: dict[str, Tensor]


def _digest(format_: str, version: str, header_text: str, tensors: list[Tensor]) -> str:
    digest = hashlib.sha256(f"{format_}\n{version}\n{header_text}\n".encode())
    return hash_tensors(digest, tensors).hexdigest()


def encode(header: Mapping[str, Any], tensors: Mapping[str, Tensor]) -> bytes:
    """The file's bytes for `header` (JSON-able; its "tensors" lists the names in `tensors`, in checksum order)."""
    header_text = json.dumps(dict(header), sort_keys=True)
    ordered = [tensors[name].detach().cpu().contiguous() for name in header["tensors"]]
    metadata = {
        "format": FORMAT,
        "version": VERSION,
        "header": header_text,
        "sha256": _digest(FORMAT, VERSION, header_text, ordered),
    }
    return save_tensors(dict(zip(header["tensors"], ordered, strict=True)), metadata=metadata)


def _metadata(data: bytes, where: str) -> dict:
    """The safetensors metadata of `data`, read from its JSON header (8 bytes of length, then JSON)."""
    if len(data) < 8:
        raise PosteriorFileError(f"{where} is not a posterior file (too short); save it again with Posterior.save")
    (size,) = struct.unpack("<Q", data[:8])
    if size > len(data) - 8:
        raise PosteriorFileError(f"{where} is truncated or not a safetensors file; save it again with Posterior.save")
    try:
        meta = json.loads(data[8 : 8 + size]).get("__metadata__")
    except (ValueError, AttributeError):
        raise PosteriorFileError(f"{where} is not a safetensors file; give a file written by Posterior.save") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise PosteriorFileError(
            f"{where} is not a bayesadmm posterior file (no format {FORMAT!r} in its metadata); "
            "give a file written by Posterior.save"
        )
    if meta.get("version") != VERSION:
        raise PosteriorFileError(
            f"{where} is of posterior format version {meta.get('version')!r}; this bayesadmm reads version {VERSION}: "
            "save it again with this version"
        )
    return meta


def decode(data: bytes, where: str) -> Contents:
    """The header and tensors of a posterior file's bytes, every field checked (`where` names the file in errors)."""
    meta = _metadata(data, where)
    try:
        tensors = load_tensors(data)
        header = json.loads(meta["header"])
    except (SafetensorError, KeyError, ValueError, TypeError) as exc:
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise PosteriorFileError(f"{where} is damaged ({reason}); save it again with Posterior.save") from None
    if not isinstance(header, dict) or header.get("family") not in FAMILIES:
        raise PosteriorFileError(f"{where}: its header names no known family ({', '.join(FAMILIES)}); save it again")
    names = list(FAMILIES[header["family"]])
    if header.get("tensors") != names or sorted(tensors) != sorted(names):
        raise PosteriorFileError(
            f"{where}: a {header['family']} posterior stores the tensors {names}, this file {sorted(tensors)}; "
            "save it again with Posterior.save"
        )
    if meta.get("sha256") != _digest(meta["format"], meta["version"], meta["header"], [tensors[n] for n in names]):
        raise PosteriorFileError(
            f"{where}: its checksum does not match: the file was changed or damaged after it was written; "
            "get the original file again"
        )
    _check_fields(header, tensors, where)
    return Contents(header, dict(tensors))


def _check_fields(header: dict, tensors: Mapping[str, Tensor], where: str) -> None:
    """dim, dtype and layout consistent with the tensors, which are finite (the Gaussian itself is checked by its
    family when the posterior is built)."""
    layout = header.get("layout")
    dim, dtype = header.get("dim"), DTYPES.get(header.get("dtype"))  # type: ignore[arg-type]
    try:
        shapes = [math.prod(shape) for _, shape in layout]  # type: ignore[union-attr]
        names_ok = all(
            isinstance(name, str) and all(type(n) is int and n >= 0 for n in shape)
            for name, shape in layout  # type: ignore[union-attr]
        )
    except (TypeError, ValueError):
        shapes, names_ok = [], False
    problems = []
    if not names_ok or not shapes or sum(shapes) != dim:
        problems.append(f"its layout does not add up to its dim {dim!r}")
    if dtype is None:
        problems.append(f"its dtype {header.get('dtype')!r} is not one of {', '.join(DTYPES)}")
    for name, tensor in tensors.items():
        if dtype is not None and tensor.dtype != dtype:
            problems.append(f"tensor {name} is {tensor.dtype}, the header says {header['dtype']}")
        elif tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            problems.append(f"tensor {name} is not finite")
    if header["family"] == "isotropic":
        precision = header.get("precision")
        if not isinstance(precision, (int, float)) or not (math.isfinite(precision) and precision > 0):
            problems.append(f"its isotropic precision {precision!r} is not a positive number")
    if problems:
        raise PosteriorFileError(f"{where}: {'; '.join(problems)}; save it again with Posterior.save")
