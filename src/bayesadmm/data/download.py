"""Downloading a data file safely: streamed to a temporary file, checked, then renamed into place."""

from __future__ import annotations

import hashlib
import os
import tempfile
import urllib.request
from collections.abc import Callable
from pathlib import Path


def download_checked(
    url: str,
    dest: Path,
    md5: str | None,
    check: Callable[[str], object],
    error: type[ValueError],
    timeout: float,
) -> None:
    """Download ``url`` to ``dest`` via a temporary file in ``dest``'s folder.

    The data are streamed into the temporary file, checked (against ``md5`` when it is given, then by ``check``,
    which raises on a bad file) and only then renamed to ``dest``: an interrupted or bad download never leaves a
    file under the real name, and the rename is atomic, so concurrent processes downloading the same file cannot
    see a half-written one.

    Raises:
        OSError: the folder cannot be made or the download fails (URLError and HTTPError are OSErrors).
        ValueError: ``error`` on an MD5 mismatch, or whatever ``check`` raises.
    """
    tmp: str | None = None
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.", suffix=".part")
        digest = hashlib.md5(usedforsecurity=False)
        with os.fdopen(fd, "wb") as out, urllib.request.urlopen(url, timeout=timeout) as resp:
            while chunk := resp.read(1 << 20):
                digest.update(chunk)
                out.write(chunk)
        if md5 is not None and digest.hexdigest() != md5:
            raise error(f"MD5 checksum mismatch: got {digest.hexdigest()}, expected {md5}")
        check(tmp)
        os.replace(tmp, dest)
        tmp = None
    finally:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)
