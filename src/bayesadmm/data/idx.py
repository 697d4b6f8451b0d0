"""The IDX file format of MNIST and Fashion-MNIST: :func:`read_idx` and a per-process cache of parsed files."""

from __future__ import annotations

import functools
import gzip
import os
import zlib
from pathlib import Path

import numpy as np
import torch

# IDX type codes (third byte of the magic number) -> big-endian numpy dtype.
_IDX_DTYPES: dict[int, np.dtype] = {
    0x08: np.dtype(">u1"),
    0x09: np.dtype(">i1"),
    0x0B: np.dtype(">i2"),
    0x0C: np.dtype(">i4"),
    0x0D: np.dtype(">f4"),
    0x0E: np.dtype(">f8"),
}
_GZIP_MAGIC = b"\x1f\x8b"


class IdxFormatError(ValueError):
    """A file is not a well-formed IDX file (bad magic, header or size)."""


def read_idx(path: str | os.PathLike) -> torch.Tensor:
    """Parse an IDX file (raw or gzip-compressed) into a tensor.

    The IDX format is a 4-byte magic number ``0x00 0x00 <type> <ndim>``, then
    ``ndim`` big-endian uint32 dimension sizes, then the data in big-endian,
    row-major order.  Compression is detected from the gzip magic bytes, not
    the file name, so a decompressed file that kept its ``.gz`` name (or a
    temporary download file) still reads.

    Args:
        path: the file to read.

    Returns:
        A tensor of the stored shape and dtype (uint8, int8, int16, int32,
        float32 or float64), in native byte order, that owns its memory.

    Raises:
        IdxFormatError: the file is not valid IDX (or not valid gzip).
        OSError: the file cannot be read.
    """
    path = Path(path)
    raw = _read_bytes(path)
    shape, dtype, header_len = _parse_header(path, raw)
    data = np.frombuffer(raw, dtype=dtype, offset=header_len).reshape(shape)
    # astype() both converts to native byte order (torch has no big-endian
    # dtypes) and copies out of the read-only bytes buffer.
    return torch.from_numpy(data.astype(dtype.newbyteorder("="), copy=True))


def _read_bytes(path: Path) -> bytes:
    """The file's bytes, gunzipped where they start with the gzip magic."""
    with open(path, "rb") as f:
        raw = f.read()
    if raw[:2] == _GZIP_MAGIC:
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError, zlib.error) as exc:
            # BadGzipFile is an OSError; a truncated stream raises EOFError.
            raise IdxFormatError(f"{path}: corrupt gzip data ({exc})") from exc
    return raw


def _parse_header(path: Path, raw: bytes) -> tuple[tuple[int, ...], np.dtype, int]:
    """The IDX header of `raw`: (shape, big-endian dtype, header length), checked against the data's size."""
    if len(raw) < 4:
        raise IdxFormatError(f"{path}: {len(raw)} bytes is too short for an IDX header")
    if raw[0] != 0 or raw[1] != 0:
        raise IdxFormatError(
            f"{path}: bad IDX magic number 0x{raw[:4].hex()} "
            "(expected 0x0000TTNN: two zero bytes, a type code, the number of dims)"
        )
    type_code, ndim = raw[2], raw[3]
    if type_code not in _IDX_DTYPES:
        known = ", ".join(f"0x{c:02x}" for c in _IDX_DTYPES)
        raise IdxFormatError(f"{path}: unknown IDX type code 0x{type_code:02x} (known: {known})")
    if ndim == 0:
        raise IdxFormatError(f"{path}: IDX header declares 0 dimensions")

    header_len = 4 + 4 * ndim
    if len(raw) < header_len:
        raise IdxFormatError(f"{path}: truncated IDX header ({len(raw)} bytes, {ndim} dims need {header_len})")
    shape = tuple(int(d) for d in np.frombuffer(raw, dtype=">u4", count=ndim, offset=4))
    dtype = _IDX_DTYPES[type_code]
    expected = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    actual = len(raw) - header_len
    if actual != expected:
        raise IdxFormatError(
            f"{path}: IDX header declares shape {shape} of {dtype.name} "
            f"({expected} data bytes) but the file holds {actual} data bytes"
        )
    return shape, dtype, header_len


@functools.lru_cache(maxsize=16)
def _read_idx_cached(path: str, mtime_ns: int, size: int) -> torch.Tensor:
    """:func:`read_idx` memoised per process.

    Keyed on the resolved path *and* the file's mtime and size, so a file that
    was replaced (e.g. re-downloaded) is parsed again rather than served
    stale.  Callers must not modify the returned tensor in place.
    """
    del mtime_ns, size  # part of the cache key only
    return read_idx(path)


def _read_idx_memo(path: Path) -> torch.Tensor:
    resolved = path.resolve()
    st = resolved.stat()
    return _read_idx_cached(str(resolved), st.st_mtime_ns, st.st_size)
