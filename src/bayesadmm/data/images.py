"""MNIST-format image datasets (MNIST, Fashion-MNIST) without torchvision.

The datasets are distributed as four IDX files per dataset (images and labels
for the ``train`` and ``t10k`` splits), usually gzip-compressed.  This module
finds them on disk or downloads them (:func:`load_image_dataset`) and parses
them directly (:func:`read_idx`, from :mod:`bayesadmm.data.idx`); it also
exports the two preprocessing steps the illustrative experiments need
(:mod:`bayesadmm.data.preprocess`): average-pool downsampling
(:func:`downsample`) and the heterogeneous "two classes per client" split
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

import os
from collections.abc import Sequence
from pathlib import Path

import torch

from bayesadmm.data.download import download_checked
from bayesadmm.data.idx import IdxFormatError, _read_idx_memo, read_idx
from bayesadmm.data.idx import _read_idx_cached as _read_idx_cached  # its cache_info() is tested here
from bayesadmm.data.preprocess import class_pair_split, downsample

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

    The file is checked (MD5 when known, then a full IDX parse) before it
    takes its name in ``dest_dir`` (:func:`~bayesadmm.data.download.download_checked`).

    Returns True on success; on failure appends one message per mirror to
    ``errors`` and returns False.
    """
    expected_md5 = CHECKSUMS.get(name, {}).get(filename)
    for mirror in MIRRORS.get(name, ()):
        url = mirror.rstrip("/") + "/" + filename
        try:
            # read_idx raises IdxFormatError unless the file parses
            download_checked(url, dest_dir / filename, expected_md5, read_idx, IdxFormatError, DOWNLOAD_TIMEOUT)
            return True
        except (OSError, ValueError) as exc:  # URLError and HTTPError are OSErrors
            errors.append(f"{url}: {exc}")
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
# Public loading API
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
