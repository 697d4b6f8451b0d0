"""CIFAR-10 and CIFAR-100 without torchvision.

Both datasets are distributed as one "python version" archive of pickled
batches (https://www.cs.toronto.edu/~kriz/cifar.html):

* ``cifar-10-python.tar.gz`` holds ``cifar-10-batches-py/data_batch_1`` ...
  ``data_batch_5`` (train, 10,000 images each) and ``test_batch`` (10,000);
* ``cifar-100-python.tar.gz`` holds ``cifar-100-python/train`` (50,000) and
  ``cifar-100-python/test`` (10,000).

Each member is a pickled dict (written by Python 2, hence
``encoding="bytes"`` and bytes keys) with ``b"data"``, a (N, 3072) uint8
array whose rows are an image's 1024 red, then 1024 green, then 1024 blue
pixels, each channel row-major over 32 x 32, and ``b"labels"`` (CIFAR-10) or
``b"fine_labels"`` (CIFAR-100's 100 classes; its 20 ``b"coarse_labels"`` are
not used).  So ``data.reshape(N, 3, 32, 32)`` is the (N, C, H, W) image tensor.

Where the data are looked for (the same places and conventions as
:mod:`bayesadmm.data.images`, see there): with a ``data_dir`` argument, there
only (``<data_dir>/<name>``, then ``<data_dir>``; nothing is downloaded);
otherwise, in order:

1. ``$BAYESADMM_DATA`` (``<dir>/<name>``, then ``<dir>``);
2. the download cache ``~/.cache/bayesadmm/<name>``.

In each directory, the extracted folder (e.g. ``cifar-10-batches-py/``, with
every member of the split) is preferred, then the ``.tar.gz`` archive, which
is read in place (never extracted).  A directory that *is* the extracted
folder (``data_dir=".../cifar-10-batches-py"``) works too.  If nothing is
found and ``download=True``, the archive is downloaded from :data:`URLS` into
the cache, verified against :data:`CHECKSUMS`, and read from there.

Unpickling can run arbitrary code, so only the expected members are ever
unpickled, and with an unpickler that refuses every global except the few
numpy needs to rebuild an array (:mod:`bayesadmm.data.cifar_format`).

The constants :data:`URLS` and :data:`CHECKSUMS` are looked up at call time,
so tests (and users with a local mirror) can replace them.
"""

from __future__ import annotations

import functools
import os
import tarfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from bayesadmm.data import images as _images
from bayesadmm.data.cifar_format import IMAGE_SHAPE as IMAGE_SHAPE  # the shape of an image, (C, H, W)
from bayesadmm.data.cifar_format import CifarFormatError, _member_name, _parse_member
from bayesadmm.data.cifar_format import _combine as _combine  # tested here
from bayesadmm.data.download import download_checked
from bayesadmm.data.images import DatasetNotFoundError

__all__ = ["CIFAR_DATASETS", "CifarFormatError", "load_cifar"]

#: Dataset names accepted by :func:`load_cifar`.
CIFAR_DATASETS: tuple[str, ...] = ("cifar10", "cifar100")

SPLITS: tuple[str, ...] = ("train", "test")


@dataclass(frozen=True)
class ArchiveLayout:
    """Where a CIFAR dataset's pieces are inside its archive."""

    archive: str  #: file name of the .tar.gz
    folder: str  #: top-level folder inside it (and when extracted)
    members: dict[str, tuple[str, ...]]  #: split -> member files in ``folder``, concatenated in order
    label_key: bytes  #: key of the labels in each pickled dict
    num_classes: int


LAYOUTS: dict[str, ArchiveLayout] = {
    "cifar10": ArchiveLayout(
        archive="cifar-10-python.tar.gz",
        folder="cifar-10-batches-py",
        members={"train": tuple(f"data_batch_{i}" for i in range(1, 6)), "test": ("test_batch",)},
        label_key=b"labels",
        num_classes=10,
    ),
    "cifar100": ArchiveLayout(
        archive="cifar-100-python.tar.gz",
        folder="cifar-100-python",
        members={"train": ("train",), "test": ("test",)},
        label_key=b"fine_labels",
        num_classes=100,
    ),
}

#: Download URL of each dataset's archive.
URLS: dict[str, str] = {
    "cifar10": "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz",
    "cifar100": "https://www.cs.toronto.edu/~kriz/cifar-100-python.tar.gz",
}

#: MD5 of each published archive; a download with another digest is rejected
#: (an archive found on disk is not checksummed, only validated by parsing).
CHECKSUMS: dict[str, str] = {
    "cifar10": "c58f30108f718f92721af3b95e74349a",
    "cifar100": "eb9058c3a382ffc7106e4002c42a8d85",
}

# ---------------------------------------------------------------------------
# Reading a split
# ---------------------------------------------------------------------------


def _read_archive(path: Path, layout: ArchiveLayout, split: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Read one split from the .tar.gz without extracting it.

    Only regular-file members with exactly the expected names are read, so
    whatever else an archive holds is never unpickled or written to disk.
    """
    wanted = [f"{layout.folder}/{m}" for m in layout.members[split]]
    raw: dict[str, bytes] = {}
    try:
        with tarfile.open(path, "r:*") as tar:
            for member in tar:  # one pass over the (gzip) stream
                key = _member_name(member.name)
                if key in wanted and member.isfile():
                    f = tar.extractfile(member)
                    assert f is not None  # regular file
                    raw[key] = f.read()
    except (tarfile.TarError, OSError, EOFError) as exc:
        raise CifarFormatError(f"{path}: not a readable .tar.gz archive ({exc})") from exc
    missing = [w for w in wanted if w not in raw]
    if missing:
        raise CifarFormatError(f"{path}: archive lacks member(s) {', '.join(missing)}")
    parts = [_parse_member(raw[w], layout.label_key, f"{path}:{w}") for w in wanted]
    return _combine(parts, layout.num_classes, str(path))


def _read_folder(folder: Path, layout: ArchiveLayout, split: str) -> tuple[torch.Tensor, torch.Tensor]:
    parts = [_parse_member((folder / m).read_bytes(), layout.label_key, str(folder / m)) for m in layout.members[split]]
    return _combine(parts, layout.num_classes, str(folder))


@functools.lru_cache(maxsize=8)
def _read_cached(kind: str, path: str, name: str, split: str, stamp: tuple) -> tuple[torch.Tensor, torch.Tensor]:
    """Parsed split memoised per process.

    ``stamp`` holds the (mtime_ns, size) of every file read, so replaced
    files are parsed again, never served stale.  Callers must not modify the
    returned tensors in place.
    """
    del stamp  # part of the cache key only
    layout = LAYOUTS[name]
    if kind == "archive":
        return _read_archive(Path(path), layout, split)
    return _read_folder(Path(path), layout, split)


def _stamp(paths: Sequence[Path]) -> tuple:
    return tuple((st.st_mtime_ns, st.st_size) for st in (p.stat() for p in paths))


# ---------------------------------------------------------------------------
# Finding and downloading
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class _Source:
    kind: str  # "folder" or "archive"
    path: Path
    files: tuple[Path, ...]  # what the cache stamp covers


def _find_in(directory: Path, layout: ArchiveLayout, split: str, notes: list[str]) -> _Source | None:
    """The split's source in ``directory``: extracted folder first, then archive."""
    folders = [directory / layout.folder]
    if directory.name == layout.folder:
        folders.append(directory)
    for folder in folders:
        if folder.is_dir():
            files = tuple(folder / m for m in layout.members[split])
            absent = [f.name for f in files if not f.is_file()]
            if not absent:
                return _Source("folder", folder, files)
            notes.append(f"{folder} lacks {', '.join(absent)}")
    archive = directory / layout.archive
    if archive.is_file():
        return _Source("archive", archive, (archive,))
    return None


def _download(name: str, dest: Path, errors: list[str]) -> bool:
    """Download the archive to ``dest`` via a temporary file, checked, then renamed.

    Checked = MD5 (when :data:`CHECKSUMS` has one) and a tar listing that
    holds every member of both splits; only then is it renamed to ``dest``
    (atomic, so concurrent processes never see a partial archive).
    """
    layout = LAYOUTS[name]
    url = URLS.get(name)
    if not url:
        errors.append(f"no download URL configured for {name!r}")
        return False
    expected_members = [f"{layout.folder}/{m}" for ms in layout.members.values() for m in ms]

    def check(tmp: str) -> None:
        try:
            with tarfile.open(tmp, "r:*") as tar:
                names = {_member_name(n) for n in tar.getnames()}
        except (tarfile.TarError, EOFError) as exc:
            raise CifarFormatError(f"not a readable .tar.gz archive ({exc})") from exc
        absent = [m for m in expected_members if m not in names]
        if absent:
            raise CifarFormatError(f"archive lacks member(s) {', '.join(absent)}")

    try:
        download_checked(url, dest, CHECKSUMS.get(name), check, CifarFormatError, _images.DOWNLOAD_TIMEOUT)
        return True
    except (OSError, ValueError) as exc:  # URLError/HTTPError are OSErrors; CifarFormatError a ValueError
        errors.append(f"{url}: {exc}")
        return False


def _not_found_message(
    name: str,
    split: str,
    locations: Sequence[tuple[Path, str]],
    notes: Sequence[str],
    download: bool,
    errors: Sequence[str],
) -> str:
    layout = LAYOUTS[name]
    members = ", ".join(layout.members[split])
    lines = [
        f"{name} {split!r} split not found: neither the extracted folder {layout.folder}/ (with {members}) "
        f"nor the archive {layout.archive} is in any searched directory.",
        "Searched, in order:",
    ]
    lines += [f"  - {directory}  ({desc})" for directory, desc in locations]
    if not os.environ.get(_images.ENV_VAR):
        lines.append(f"  (${_images.ENV_VAR} is not set)")
    lines += [f"  note: {note}" for note in notes]
    if not download:
        lines.append("Download: not attempted (download=False).")
    else:
        lines.append(f"Download into {_images.cache_dir(name)} failed:")
        lines += [f"  - {err}" for err in errors]
    lines += [
        "To get the data, do one of:",
        f"  - download {URLS.get(name, '(no URL configured)')} and put {layout.archive} (or its extracted "
        f"{layout.folder}/) into a directory given as data_dir=... or ${_images.ENV_VAR}, directly or in a "
        f"'{name}' subdirectory, or into {_images.cache_dir(name)}",
        "  - " + ("retry while online" if download else "call with download=True while online"),
    ]
    return "\n".join(lines)


def _resolve(name: str, split: str, data_dir, download: bool) -> _Source:
    layout = LAYOUTS[name]
    # images._search_locations gives data_dir/<name> and data_dir alone, or $BAYESADMM_DATA/<name>,
    # $BAYESADMM_DATA, (system dirs: none for CIFAR), the cache.
    locations = _images._search_locations(name, data_dir)
    download = download and data_dir is None  # a named folder that lacks the data is an error, not a download
    notes: list[str] = []
    for directory, _ in locations:
        found = _find_in(directory, layout, split, notes)
        if found is not None:
            return found
    errors: list[str] = []
    if download:
        dest = _images.cache_dir(name) / layout.archive
        if _download(name, dest, errors):
            return _Source("archive", dest, (dest,))
    raise DatasetNotFoundError(
        _not_found_message(name, split, locations, notes, download, errors),
        dataset=name,
        split=split,
        missing=[layout.archive],
        searched=[d for d, _ in locations],
    )


# ---------------------------------------------------------------------------
# Public API
# ---------------------------------------------------------------------------


def load_cifar(
    name: str,
    split: str,
    data_dir: str | os.PathLike | None = None,
    download: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Load one split of CIFAR-10 or CIFAR-100 (fine labels).

    See the module docstring for the format and where the data are looked
    for.  Parsed splits are cached per process; each call still returns
    fresh tensors the caller may modify.

    Args:
        name: ``"cifar10"`` or ``"cifar100"``.
        split: ``"train"`` (50,000 images) or ``"test"`` (10,000).
        data_dir: a directory to search first (it or its ``<name>``
            subdirectory must hold the archive or the extracted folder).
        download: download the archive into ``~/.cache/bayesadmm/<name>`` if
            it is found nowhere.

    Returns:
        ``(images, labels)``: uint8 images of shape ``(N, 3, 32, 32)`` (RGB,
        channels first) and int64 labels of shape ``(N,)`` in
        ``[0, 10)`` or ``[0, 100)``.

    Raises:
        ValueError: unknown ``name`` or ``split``.
        DatasetNotFoundError: found nowhere and not downloaded; the message
            lists every place searched and how to get the data.
        CifarFormatError: a file or archive was found but is malformed.
    """
    if name not in CIFAR_DATASETS:
        raise ValueError(f"unknown dataset {name!r}; expected one of {CIFAR_DATASETS}")
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; expected one of {SPLITS}")
    source = _resolve(name, split, data_dir, download)
    resolved = source.path.resolve()
    images, labels = _read_cached(source.kind, str(resolved), name, split, _stamp(source.files))
    # Copies, so in-place edits by the caller cannot corrupt the cache.
    return images.clone(), labels.clone()
