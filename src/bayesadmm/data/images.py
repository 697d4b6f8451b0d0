"""MNIST-format image datasets (MNIST, Fashion-MNIST) without torchvision.

The datasets are distributed as four IDX files per dataset (images and labels
for the ``train`` and ``t10k`` splits), usually gzip-compressed.  This module
parses them directly (:func:`read_idx`), finds them on disk or downloads them
(:func:`load_image_dataset`), and provides the two preprocessing steps the
illustrative experiments need: average-pool downsampling (:func:`downsample`)
and the heterogeneous "two classes per client" split
(:func:`class_pair_split`).

Where the files are looked for. With a ``data_dir`` argument, there only
(``<data_dir>/<name>``, then ``<data_dir>``): a folder that lacks the data is an
error, never a fallback to another copy or a download. Otherwise, in order (the
first directory that holds both files of the requested split wins):

1. the directory in the environment variable ``BAYESADMM_DATA``
   (``<dir>/<name>``, then ``<dir>``);
2. for Fashion-MNIST, ``/usr/share/datasets/fashion-mnist``, where the Debian
   package ``dataset-fashion-mnist`` installs it;
3. the download cache ``~/.cache/bayesadmm/<name>``.

If the files are still missing and ``download=True``, they are downloaded into
the cache from :data:`MIRRORS` (verified against :data:`CHECKSUMS` and by
parsing them) and loaded from there.

The module-level constants :data:`MIRRORS`, :data:`CHECKSUMS` and
:data:`SYSTEM_DIRS` and the function :func:`cache_dir` are looked up at call
time, so tests (and users with a local mirror) can replace them.
"""

from __future__ import annotations

import functools
import gzip
import hashlib
import os
import tempfile
import urllib.request
import zlib
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np
import torch

__all__ = [
    "DATASETS",
    "DatasetNotFoundError",
    "IdxFormatError",
    "class_pair_split",
    "downsample",
    "load_image_dataset",
    "read_idx",
]

#: Dataset names accepted by :func:`load_image_dataset`.
DATASETS: tuple[str, ...] = ("fashion-mnist", "mnist")

#: Base names (without ``.gz``) of the (images, labels) IDX files of each split.
SPLIT_FILES: dict[str, tuple[str, str]] = {
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}

#: Environment variable naming a directory that holds the IDX files.
ENV_VAR = "BAYESADMM_DATA"

#: Debian packages that ship a dataset: name -> (package, install directory).
APT_PACKAGES: dict[str, tuple[str, Path]] = {
    "fashion-mnist": ("dataset-fashion-mnist", Path("/usr/share/datasets/fashion-mnist")),
}

#: System-wide install locations, per dataset (searched after the env var).
SYSTEM_DIRS: dict[str, tuple[Path, ...]] = {name: (d,) for name, (_, d) in APT_PACKAGES.items()}

#: Download mirrors, tried in order; ``<mirror><file>.gz`` must be the file.
#: The Fashion-MNIST bucket is an S3 *website* endpoint, which serves plain
#: HTTP only (S3 website endpoints do not support HTTPS), so its URL is
#: ``http://``; :data:`CHECKSUMS` is what protects those downloads.
MIRRORS: dict[str, tuple[str, ...]] = {
    "fashion-mnist": ("http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/",),
    "mnist": (
        "https://ossci-datasets.s3.amazonaws.com/mnist/",
        "https://storage.googleapis.com/cvdf-datasets/mnist/",
    ),
}

#: MD5 digests of the published ``.gz`` files.  A download whose digest
#: differs is rejected; a file without an entry here is only checked by
#: parsing it.  (Files found on disk are not checksummed: the Debian package,
#: for one, ships recompressed ``.gz`` files with other digests.)
CHECKSUMS: dict[str, dict[str, str]] = {
    "fashion-mnist": {
        "train-images-idx3-ubyte.gz": "8d4fb7e6c68d591d4c3dfef9ec88bf0d",
        "train-labels-idx1-ubyte.gz": "25c81989df183df01b3e8a0aad5dffbe",
        "t10k-images-idx3-ubyte.gz": "bef4ecab320f06d8554ea6380940ec79",
        "t10k-labels-idx1-ubyte.gz": "bb300cfdad3c16e7a12a480ee83cd310",
    },
    "mnist": {
        "train-images-idx3-ubyte.gz": "f68b3c2dcbeaaa9fbdd348bbdeb94873",
        "train-labels-idx1-ubyte.gz": "d53e105ee54ea40749a09fcbcd1e9432",
        "t10k-images-idx3-ubyte.gz": "9fb629c4189551a2d022fa330f9573f3",
        "t10k-labels-idx1-ubyte.gz": "ec29112dd5afa0611ce80d1b7f02629c",
    },
}

#: Seconds to wait on a stalled connection before trying the next mirror.
DOWNLOAD_TIMEOUT = 60.0

IMAGE_SIZE = 28
NUM_CLASSES = 10  # both MNIST and FashionMNIST

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


class DatasetNotFoundError(FileNotFoundError):
    """The IDX files of a dataset split were neither found nor downloaded.

    Attributes:
        dataset: dataset name, e.g. ``"fashion-mnist"``.
        split: ``"train"`` or ``"test"``.
        missing: file names (without ``.gz``) that no searched place held.
        searched: every directory that was searched, in order.
    """

    def __init__(
        self,
        message: str,
        *,
        dataset: str,
        split: str,
        missing: Sequence[str],
        searched: Sequence[Path],
    ) -> None:
        super().__init__(message)
        self.dataset = dataset
        self.split = split
        self.missing = tuple(missing)
        self.searched = tuple(searched)


# ---------------------------------------------------------------------------
# IDX parsing
# ---------------------------------------------------------------------------


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
    with open(path, "rb") as f:
        raw = f.read()
    if raw[:2] == _GZIP_MAGIC:
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError, zlib.error) as exc:
            # BadGzipFile is an OSError; a truncated stream raises EOFError.
            raise IdxFormatError(f"{path}: corrupt gzip data ({exc})") from exc

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

    data = np.frombuffer(raw, dtype=dtype, offset=header_len).reshape(shape)
    # astype() both converts to native byte order (torch has no big-endian
    # dtypes) and copies out of the read-only bytes buffer.
    return torch.from_numpy(data.astype(dtype.newbyteorder("="), copy=True))


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


# ---------------------------------------------------------------------------
# Finding and downloading the files
# ---------------------------------------------------------------------------


def cache_dir(name: str) -> Path:
    """The download cache directory of dataset ``name``: ``~/.cache/bayesadmm/<name>``."""
    return Path.home() / ".cache" / "bayesadmm" / name


def _find_file(directory: Path, base: str) -> Path | None:
    """``directory/base`` or ``directory/base.gz``, preferring the uncompressed one."""
    for candidate in (directory / base, directory / f"{base}.gz"):
        if candidate.is_file():
            return candidate
    return None


def _find_split(directory: Path, bases: Sequence[str]) -> list[Path] | None:
    """The split's files if *all* of them are in ``directory``, else None.

    Images and labels are taken from one directory only: pairing images from
    one place with labels from another could silently mismatch datasets.
    """
    found = [_find_file(directory, base) for base in bases]
    return None if any(p is None for p in found) else found  # type: ignore[return-value]


def _search_locations(name: str, data_dir: str | os.PathLike | None) -> list[tuple[Path, str]]:
    """The (directory, description) pairs to search, in priority order."""
    locations: list[tuple[Path, str]] = []
    # For the two user-given roots, the per-dataset subdirectory comes first
    # so that a shared root with e.g. mnist/ and fashion-mnist/ resolves to the
    # right dataset even if some other dataset's files also lie in the root.
    if data_dir is not None:
        # the folder the user named, and only it: another copy found elsewhere could be other data
        root = Path(data_dir).expanduser()
        return [(root / name, "data_dir argument"), (root, "data_dir argument")]
    env = os.environ.get(ENV_VAR)
    if env:
        root = Path(env).expanduser()
        locations += [(root / name, f"${ENV_VAR}"), (root, f"${ENV_VAR}")]
    package = APT_PACKAGES.get(name)
    for directory in SYSTEM_DIRS.get(name, ()):
        what = f"Debian package {package[0]}" if package else "system location"
        locations.append((directory, what))
    locations.append((cache_dir(name), "download cache"))
    return locations


def _download_file(name: str, filename: str, dest_dir: Path, errors: list[str]) -> bool:
    """Download ``filename`` from the first mirror that serves a valid copy.

    The data are streamed into a temporary file in ``dest_dir``, checked (MD5
    when known, then a full IDX parse) and only then renamed to
    ``dest_dir/filename``: an interrupted or bad download never leaves a file
    under the real name, and the rename is atomic, so concurrent processes
    downloading the same file cannot see a half-written one.

    Returns True on success; on failure appends one message per mirror to
    ``errors`` and returns False.
    """
    expected_md5 = CHECKSUMS.get(name, {}).get(filename)
    for mirror in MIRRORS.get(name, ()):
        url = mirror.rstrip("/") + "/" + filename
        tmp_path: str | None = None
        try:
            dest_dir.mkdir(parents=True, exist_ok=True)
            fd, tmp_path = tempfile.mkstemp(dir=dest_dir, prefix=f".{filename}.", suffix=".part")
            digest = hashlib.md5(usedforsecurity=False)
            with os.fdopen(fd, "wb") as out, urllib.request.urlopen(url, timeout=DOWNLOAD_TIMEOUT) as resp:
                while chunk := resp.read(1 << 20):
                    digest.update(chunk)
                    out.write(chunk)
            if expected_md5 is not None and digest.hexdigest() != expected_md5:
                raise IdxFormatError(f"MD5 checksum mismatch: got {digest.hexdigest()}, expected {expected_md5}")
            read_idx(tmp_path)  # raises IdxFormatError unless the file parses
            os.replace(tmp_path, dest_dir / filename)
            tmp_path = None
            return True
        except (OSError, ValueError) as exc:  # URLError and HTTPError are OSErrors
            errors.append(f"{url}: {exc}")
        finally:
            if tmp_path is not None:
                Path(tmp_path).unlink(missing_ok=True)
    if not MIRRORS.get(name):
        errors.append(f"{filename}: no download mirror configured for {name!r}")
    return False


def _not_found_message(
    name: str,
    split: str,
    missing: Sequence[str],
    locations: Sequence[tuple[Path, str]],
    download: bool,
    download_errors: Sequence[str],
) -> str:
    bases = SPLIT_FILES[split]
    if missing:
        what = "missing " + ", ".join(f"{b}[.gz]" for b in missing)
    else:
        what = f"{' and '.join(bases)} were never found together in one directory"
    lines = [f"{name} {split!r} split not found: {what}.", "Searched, in order:"]
    lines += [f"  - {directory}  ({desc})" for directory, desc in locations]
    if not os.environ.get(ENV_VAR):
        lines.append(f"  (${ENV_VAR} is not set)")
    if not download:
        lines.append("Download: not attempted (download=False).")
    else:
        lines.append(f"Download into {cache_dir(name)} failed:")
        lines += [f"  - {err}" for err in download_errors]
    lines.append("To get the files, do one of:")
    if name in APT_PACKAGES:
        package, directory = APT_PACKAGES[name]
        lines.append(f"  - apt-get install {package}   (installs them into {directory})")
    lines.append(
        f"  - pass data_dir=... or set {ENV_VAR} to a directory containing the IDX files "
        f"({', '.join(b + '[.gz]' for b in bases)}), directly or in a '{name}' subdirectory"
    )
    how = "retry while online" if download else "call with download=True while online"
    lines.append(f"  - {how} (mirrors: " + ", ".join(MIRRORS.get(name, ())) + ")")
    return "\n".join(lines)


def _resolve_split(name: str, split: str, data_dir: str | os.PathLike | None, download: bool) -> list[Path]:
    """Paths of the split's (images, labels) files, downloading them if needed."""
    bases = SPLIT_FILES[split]
    locations = _search_locations(name, data_dir)
    for directory, _ in locations:
        found = _find_split(directory, bases)
        if found is not None:
            return found

    download_errors: list[str] = []
    download = download and data_dir is None  # a named folder that lacks the data is an error, not a download
    if download:
        target = cache_dir(name)
        # Only fetch what the cache lacks (e.g. after an interrupted download).
        ok = all(
            _find_file(target, base) is not None or _download_file(name, f"{base}.gz", target, download_errors)
            for base in bases
        )
        found = _find_split(target, bases) if ok else None
        if found is not None:
            return found

    missing = [b for b in bases if all(_find_file(d, b) is None for d, _ in locations)]
    raise DatasetNotFoundError(
        _not_found_message(name, split, missing, locations, download, download_errors),
        dataset=name,
        split=split,
        missing=missing,
        searched=[d for d, _ in locations],
    )


# ---------------------------------------------------------------------------
# Public loading and preprocessing API
# ---------------------------------------------------------------------------


def load_image_dataset(
    name: str,
    split: str,
    data_dir: str | os.PathLike | None = None,
    download: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Load one split of an MNIST-format image dataset.

    See the module docstring for where the files are searched for.  Parsed
    files are cached per process, so loading the same split again is cheap;
    each call still returns fresh tensors that the caller may modify.

    Args:
        name: ``"fashion-mnist"`` or ``"mnist"``.
        split: ``"train"`` (60,000 examples) or ``"test"`` (10,000).
        data_dir: the directory that holds the data (it or its ``<name>``
            subdirectory must hold the split's IDX files, raw or ``.gz``); only
            it is searched, and nothing is downloaded.
        download: download missing files into ``~/.cache/bayesadmm/<name>``.

    Returns:
        ``(images, labels)``: uint8 images of shape ``(N, 28, 28)`` and int64
        labels of shape ``(N,)``.

    Raises:
        ValueError: unknown ``name`` or ``split``, or files of the wrong shape.
        DatasetNotFoundError: the files were neither found nor downloaded; the
            message lists every place searched and how to get the files.
        IdxFormatError: a file that was found is not valid IDX.
    """
    if name not in DATASETS:
        raise ValueError(f"unknown dataset {name!r}; expected one of {DATASETS}")
    if split not in SPLIT_FILES:
        raise ValueError(f"unknown split {split!r}; expected one of {tuple(SPLIT_FILES)}")

    images_path, labels_path = _resolve_split(name, split, data_dir, download)
    images = _read_idx_memo(images_path)
    labels = _read_idx_memo(labels_path)

    if images.dtype != torch.uint8 or images.ndim != 3 or tuple(images.shape[1:]) != (IMAGE_SIZE, IMAGE_SIZE):
        raise ValueError(
            f"{images_path}: expected uint8 images of shape (N, {IMAGE_SIZE}, {IMAGE_SIZE}), "
            f"got {images.dtype} {tuple(images.shape)}"
        )
    if labels.dtype != torch.uint8 or labels.ndim != 1:
        raise ValueError(f"{labels_path}: expected 1-D uint8 labels, got {labels.dtype} {tuple(labels.shape)}")
    if labels.shape[0] != images.shape[0]:
        raise ValueError(
            f"{images_path} holds {images.shape[0]} images but {labels_path} holds {labels.shape[0]} labels"
        )
    if labels.numel() and int(labels.max()) >= NUM_CLASSES:
        raise ValueError(
            f"{labels_path}: labels must be class numbers 0..{NUM_CLASSES - 1}, found {int(labels.max())}; "
            "the file is not a label file of this dataset"
        )
    # clone()/to() give the caller its own copy, so in-place edits (e.g.
    # normalising) cannot corrupt the process-wide cache.
    return images.clone(), labels.to(torch.int64)


def downsample(images: torch.Tensor, size: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Average-pool square images down to ``size x size``.

    Each output pixel is the mean of a ``k x k`` block of input pixels,
    ``k = H // size``; values stay on the input scale (0..255 for raw uint8
    images), and no normalisation is applied.

    Args:
        images: tensor of shape ``(N, H, H)`` (e.g. ``(N, 28, 28)``), any
            real dtype.
        size: output side length; must divide ``H`` (7 or 14 for 28x28).
        dtype: floating dtype of the result (default float32).

    Returns:
        Tensor of shape ``(N, size, size)`` and dtype ``dtype``.

    Raises:
        ValueError: wrong shape, ``size`` not dividing ``H``, or a
            non-floating ``dtype``.
    """
    if not dtype.is_floating_point:
        raise ValueError(f"dtype must be a floating dtype, got {dtype}")
    if images.ndim != 3 or images.shape[1] != images.shape[2]:
        raise ValueError(f"expected images of shape (N, H, H), got {tuple(images.shape)}")
    side = images.shape[1]
    if not isinstance(size, int) or size <= 0 or side % size != 0:
        divisors = [d for d in range(1, side + 1) if side % d == 0]
        raise ValueError(f"size must be a positive divisor of the image side {side} (one of {divisors}), got {size!r}")
    k = side // size
    n = images.shape[0]
    # Split each axis into (block index, offset within block) and average
    # over the offsets.  Converting first avoids uint8 overflow in the sum.
    blocks = images.to(dtype).reshape(n, size, k, size, k)
    return blocks.mean(dim=(2, 4))


def class_pair_split(
    labels: torch.Tensor,
    pairs: Iterable[Iterable[int]] = ((0, 1), (2, 3), (4, 5), (6, 7), (8, 9)),
) -> list[torch.Tensor]:
    """Heterogeneous federated split: client ``k`` gets the classes in ``pairs[k]``.

    This is the split of the illustrative experiments: with the default pairs,
    five clients each hold all examples of two classes.  Examples whose label
    is in no pair are left out.  A group may hold any number of classes.

    Args:
        labels: 1-D integer tensor of class labels.
        pairs: one group of labels per client; groups must not share labels
            (so that no example goes to two clients).

    Returns:
        One int64 tensor per client with the indices (into ``labels``) of its
        examples, in increasing order.

    Raises:
        ValueError: ``labels`` not 1-D, or a label in more than one group.
    """
    labels = torch.as_tensor(labels)
    if labels.ndim != 1:
        raise ValueError(f"labels must be 1-D, got shape {tuple(labels.shape)}")
    groups = [tuple(int(c) for c in group) for group in pairs]
    seen: set[int] = set()
    for group in groups:
        repeated = seen.intersection(group)
        if repeated:
            raise ValueError(f"label(s) {sorted(repeated)} appear in more than one group of {groups}")
        seen.update(group)
    # nonzero() returns indices in increasing order.
    return [
        torch.isin(labels, torch.tensor(group, dtype=labels.dtype)).nonzero().flatten().to(torch.int64)
        for group in groups
    ]
