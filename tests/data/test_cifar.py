"""Tests for bayesadmm.data.cifar.

Everything except ``test_real_cifar`` runs on small synthetic archives written
to tmp_path in the real format (the batches are pickled byte for byte the way
Python 2 wrote the published files), so the suite passes without the data
and without network access (downloads go through ``file://`` URLs).
"""

from __future__ import annotations

import hashlib
import io
import os
import pickle
import struct
import tarfile
from pathlib import Path

import numpy as np
import pytest
import torch

from bayesadmm.data import CIFAR_DATASETS, CifarFormatError, DatasetNotFoundError, load_cifar
from bayesadmm.data import cifar as cifar_mod

LAYOUT = {
    "cifar10": ("cifar-10-python.tar.gz", "cifar-10-batches-py", b"labels", 10),
    "cifar100": ("cifar-100-python.tar.gz", "cifar-100-python", b"fine_labels", 100),
}
MEMBERS = {
    "cifar10": {"train": [f"data_batch_{i}" for i in range(1, 6)], "test": ["test_batch"]},
    "cifar100": {"train": ["train"], "test": ["test"]},
}


# ---------------------------------------------------------------------------
# writing the real format
# ---------------------------------------------------------------------------


def _py2_str(b: bytes) -> bytes:
    """A Python 2 ``str`` (SHORT_BINSTRING / BINSTRING): ``bytes`` under encoding="bytes"."""
    return (b"U" + bytes([len(b)]) + b) if len(b) < 256 else (b"T" + struct.pack("<I", len(b)) + b)


def _py2_int(i: int) -> bytes:
    return b"J" + struct.pack("<i", i)


def py2_batch_pickle(batch: dict[bytes, object]) -> bytes:
    """Pickle a CIFAR batch the way Python 2 + numpy 1 did (protocol 2).

    ``batch`` maps bytes keys to a (N, 3072) uint8 array, a list of ints or
    bytes.  The array is written through ``numpy.core.multiarray._reconstruct``
    with Python 2 strings, as in the published files.
    """
    out = b"\x80\x02}("
    for key, value in batch.items():
        out += _py2_str(key)
        if isinstance(value, np.ndarray):
            dtype = (
                b"cnumpy\ndtype\n" + _py2_str(b"u1") + b"K\x00K\x01\x87R"
                b"(K\x03" + _py2_str(b"|") + b"NNNJ\xff\xff\xff\xffJ\xff\xff\xff\xffK\x00tb"
            )
            out += (
                b"cnumpy.core.multiarray\n_reconstruct\ncnumpy\nndarray\nK\x00\x85" + _py2_str(b"b") + b"\x87R"
                b"(K\x01" + _py2_int(value.shape[0]) + _py2_int(value.shape[1]) + b"\x86" + dtype + b"\x89"
                + _py2_str(np.ascontiguousarray(value).tobytes()) + b"tb"
            )
        elif isinstance(value, list):
            out += b"(" + b"".join(_py2_int(int(v)) for v in value) + b"l"
        else:
            out += _py2_str(value)
    return out + b"u."


def make_batches(name: str, sizes: dict[str, int], seed: int = 0) -> dict[str, list[dict]]:
    """Random batches per split (each member of a split gets ``sizes[split]`` images)."""
    rng = np.random.default_rng(seed)
    label_key, num_classes = LAYOUT[name][2], LAYOUT[name][3]
    out = {}
    for split, members in MEMBERS[name].items():
        out[split] = []
        for member in members:
            n = sizes[split]
            batch = {
                b"batch_label": member.encode(),
                b"data": rng.integers(0, 256, size=(n, 3072), dtype=np.uint8),
                label_key: rng.integers(0, num_classes, size=n).tolist(),
            }
            if name == "cifar100":
                batch[b"coarse_labels"] = rng.integers(0, 20, size=n).tolist()
            out[split].append(batch)
    return out


def expected(batches: dict[str, list[dict]], name: str, split: str) -> tuple[torch.Tensor, torch.Tensor]:
    label_key = LAYOUT[name][2]
    data = np.concatenate([b[b"data"] for b in batches[split]])
    labels = np.concatenate([np.asarray(b[label_key]) for b in batches[split]])
    return torch.from_numpy(data.reshape(-1, 3, 32, 32)), torch.from_numpy(labels.astype(np.int64))


def member_bytes(name: str, batches, serialise=py2_batch_pickle) -> dict[str, bytes]:
    folder = LAYOUT[name][1]
    files = {
        f"{folder}/{m}": serialise(b)
        for split in MEMBERS[name]
        for m, b in zip(MEMBERS[name][split], batches[split])
    }
    # The real archives hold more files; none of them may ever be unpickled.
    evil = b"cos\nsystem\n(S'echo pwned'\ntR."
    files[f"{folder}/batches.meta" if name == "cifar10" else f"{folder}/meta"] = evil
    files[f"{folder}/readme.html"] = b"<html></html>"
    return files


def write_folder(directory: Path, name: str, batches, serialise=py2_batch_pickle) -> Path:
    for rel, data in member_bytes(name, batches, serialise).items():
        path = directory / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return directory / LAYOUT[name][1]


def write_archive(directory: Path, name: str, batches, prefix: str = "", files: dict | None = None) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / LAYOUT[name][0]
    files = member_bytes(name, batches) if files is None else files
    with tarfile.open(path, "w:gz") as tar:
        for rel, data in files.items():
            info = tarfile.TarInfo(prefix + rel)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def assert_loaded(loaded, want) -> None:
    images, labels = loaded
    assert images.dtype == torch.uint8 and images.shape == want[0].shape and images.shape[1:] == (3, 32, 32)
    assert labels.dtype == torch.int64 and labels.shape == want[1].shape
    assert torch.equal(images, want[0]) and torch.equal(labels, want[1])


SIZES = {"train": 3, "test": 2}


@pytest.fixture
def isolated(tmp_path, monkeypatch):
    """No env var, an empty cache under a fake HOME, a dead download URL, a cold parse cache."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("BAYESADMM_DATA", raising=False)
    dead = (tmp_path / "nowhere" / "missing.tar.gz").as_uri()
    monkeypatch.setattr(cifar_mod, "URLS", {"cifar10": dead, "cifar100": dead})
    monkeypatch.setattr(cifar_mod, "CHECKSUMS", {})
    cifar_mod._read_cached.cache_clear()
    yield {"home": home, "cache": home / ".cache" / "bayesadmm"}
    cifar_mod._read_cached.cache_clear()


# ---------------------------------------------------------------------------
# the format
# ---------------------------------------------------------------------------


def test_py2_pickles_read_with_plain_pickle_too():
    # The helper writes what pickle.load(f, encoding="bytes") reads, as the
    # CIFAR web page's own recipe does.
    data = np.arange(2 * 3072, dtype=np.uint64).astype(np.uint8).reshape(2, 3072)
    batch = pickle.loads(py2_batch_pickle({b"data": data, b"labels": [3, 4]}), encoding="bytes")
    assert np.array_equal(batch[b"data"], data) and batch[b"labels"] == [3, 4]


@pytest.mark.parametrize("name", CIFAR_DATASETS)
@pytest.mark.parametrize("kind", ["folder", "archive", "archive-dot-prefix"])
def test_load_both_splits(tmp_path, isolated, name, kind):
    batches = make_batches(name, SIZES)
    if kind == "folder":
        write_folder(tmp_path / "data", name, batches)
    else:
        write_archive(tmp_path / "data", name, batches, prefix="./" if kind == "archive-dot-prefix" else "")
    for split in ("train", "test"):
        loaded = load_cifar(name, split, data_dir=tmp_path / "data", download=False)
        assert_loaded(loaded, expected(batches, name, split))
    n_train = len(MEMBERS[name]["train"]) * SIZES["train"]
    assert load_cifar(name, "train", data_dir=tmp_path / "data", download=False)[0].shape[0] == n_train


def test_pixel_layout_is_channel_then_row_major():
    # data row = 1024 red, 1024 green, 1024 blue values, each row-major 32 x 32.
    data = np.zeros((1, 3072), dtype=np.uint8)
    c, h, w = 2, 5, 7
    data[0, c * 1024 + h * 32 + w] = 255
    images, _ = cifar_mod._combine([(data, np.array([0]))], 10, "test")
    assert images[0, c, h, w] == 255 and int(images.sum()) == 255


def test_python3_pickles_are_accepted(tmp_path, isolated):
    batches = make_batches("cifar10", SIZES)
    for protocol in (2, pickle.HIGHEST_PROTOCOL):
        root = tmp_path / f"p{protocol}"
        write_folder(root, "cifar10", batches, serialise=lambda b, p=protocol: pickle.dumps(b, protocol=p))
        loaded = load_cifar("cifar10", "test", data_dir=root, download=False)
        assert_loaded(loaded, expected(batches, "cifar10", "test"))


# ---------------------------------------------------------------------------
# where the data are found
# ---------------------------------------------------------------------------


def test_search_locations(tmp_path, isolated, monkeypatch):
    name = "cifar100"
    places = ["dd_sub", "dd", "env_sub", "env", "cache"]
    sets = {where: make_batches(name, SIZES, seed=i) for i, where in enumerate(places)}
    write_archive(tmp_path / "dd" / name, name, sets["dd_sub"])
    write_folder(tmp_path / "dd", name, sets["dd"])
    write_folder(tmp_path / "env" / name, name, sets["env_sub"])
    write_archive(tmp_path / "env", name, sets["env"])
    write_archive(isolated["cache"] / name, name, sets["cache"])
    monkeypatch.setenv("BAYESADMM_DATA", str(tmp_path / "env"))

    def load():
        return load_cifar(name, "test", data_dir=tmp_path / "dd", download=False)

    assert_loaded(load(), expected(sets["dd_sub"], name, "test"))  # <data_dir>/<name> first
    (tmp_path / "dd" / name / LAYOUT[name][0]).unlink()
    assert_loaded(load(), expected(sets["dd"], name, "test"))  # then <data_dir>
    assert_loaded(load_cifar(name, "test", download=False), expected(sets["env_sub"], name, "test"))
    os.rename(tmp_path / "env" / name, tmp_path / "env" / "elsewhere")
    assert_loaded(load_cifar(name, "test", download=False), expected(sets["env"], name, "test"))
    monkeypatch.delenv("BAYESADMM_DATA")
    assert_loaded(load_cifar(name, "test", download=False), expected(sets["cache"], name, "test"))


def test_folder_preferred_over_archive_and_folder_itself_as_data_dir(tmp_path, isolated):
    a, b = make_batches("cifar10", SIZES, seed=1), make_batches("cifar10", SIZES, seed=2)
    folder = write_folder(tmp_path, "cifar10", a)
    write_archive(tmp_path, "cifar10", b)
    assert_loaded(load_cifar("cifar10", "test", data_dir=tmp_path, download=False), expected(a, "cifar10", "test"))
    assert_loaded(load_cifar("cifar10", "train", data_dir=folder, download=False), expected(a, "cifar10", "train"))


def test_incomplete_folder_is_skipped_and_reported(tmp_path, isolated):
    batches = make_batches("cifar10", SIZES)
    folder = write_folder(tmp_path / "partial", "cifar10", batches)
    (folder / "data_batch_3").unlink()
    # the test split is complete, the train split is not
    loaded = load_cifar("cifar10", "test", data_dir=tmp_path / "partial", download=False)
    assert_loaded(loaded, expected(batches, "cifar10", "test"))
    with pytest.raises(DatasetNotFoundError, match="lacks data_batch_3"):
        load_cifar("cifar10", "train", data_dir=tmp_path / "partial", download=False)
    # an archive next to it completes the picture
    write_archive(tmp_path / "partial", "cifar10", batches)
    loaded = load_cifar("cifar10", "train", data_dir=tmp_path / "partial", download=False)
    assert_loaded(loaded, expected(batches, "cifar10", "train"))


def test_not_found_message(tmp_path, isolated):
    with pytest.raises(DatasetNotFoundError) as info:
        load_cifar("cifar10", "train", download=False)
    err = info.value
    msg = str(err)
    assert "cifar-10-batches-py/ (with data_batch_1, data_batch_2" in msg and "cifar-10-python.tar.gz" in msg
    assert f"  - {isolated['cache'] / 'cifar10'}  (" in msg
    assert "$BAYESADMM_DATA is not set" in msg and "download=False" in msg
    assert "call with download=True" in msg
    assert err.dataset == "cifar10" and err.split == "train" and err.missing == ("cifar-10-python.tar.gz",)
    assert err.searched[-1] == isolated["cache"] / "cifar10"
    assert isinstance(err, FileNotFoundError)
    # a data_dir without the data is searched alone: no fallback to another copy, no download
    with pytest.raises(DatasetNotFoundError) as info:
        load_cifar("cifar10", "train", data_dir=tmp_path / "dd", download=True)
    assert list(info.value.searched) == [tmp_path / "dd" / "cifar10", tmp_path / "dd"]


# ---------------------------------------------------------------------------
# download
# ---------------------------------------------------------------------------


def serve(tmp_path: Path, name: str, batches, monkeypatch, md5: str | None = "right", files=None) -> Path:
    archive = write_archive(tmp_path / "mirror", name, batches, files=files)
    digest = hashlib.md5(archive.read_bytes()).hexdigest() if md5 == "right" else md5
    monkeypatch.setattr(cifar_mod, "URLS", {name: archive.as_uri()})
    monkeypatch.setattr(cifar_mod, "CHECKSUMS", {name: digest} if digest else {})
    return archive


@pytest.mark.parametrize("name", CIFAR_DATASETS)
def test_download_via_file_url(tmp_path, isolated, monkeypatch, name):
    batches = make_batches(name, SIZES)
    archive = serve(tmp_path, name, batches, monkeypatch)
    with pytest.raises(DatasetNotFoundError):
        load_cifar(name, "train", download=False)  # nothing there yet
    assert_loaded(load_cifar(name, "train"), expected(batches, name, "train"))
    cache = isolated["cache"] / name
    assert sorted(p.name for p in cache.iterdir()) == [LAYOUT[name][0]]  # no temporary files left
    assert (cache / LAYOUT[name][0]).read_bytes() == archive.read_bytes()
    # later loads use the cache, not the URL
    monkeypatch.setattr(cifar_mod, "URLS", {})
    assert_loaded(load_cifar(name, "test"), expected(batches, name, "test"))


@pytest.mark.parametrize("problem", ["checksum", "not-a-tar", "member-missing"])
def test_bad_download_is_rejected_and_leaves_no_file(tmp_path, isolated, monkeypatch, problem):
    batches = make_batches("cifar10", SIZES)
    if problem == "checksum":
        serve(tmp_path, "cifar10", batches, monkeypatch, md5="0" * 32)
        match = "MD5 checksum mismatch"
    elif problem == "not-a-tar":
        bogus = tmp_path / "mirror" / "cifar-10-python.tar.gz"
        bogus.parent.mkdir()
        bogus.write_bytes(b"<html>404</html>")
        monkeypatch.setattr(cifar_mod, "URLS", {"cifar10": bogus.as_uri()})
        match = "not a readable .tar.gz"
    else:
        files = member_bytes("cifar10", batches)
        del files["cifar-10-batches-py/test_batch"]
        serve(tmp_path, "cifar10", batches, monkeypatch, md5=None, files=files)
        match = "archive lacks member.*test_batch"
    with pytest.raises(DatasetNotFoundError, match=match) as info:
        load_cifar("cifar10", "train")
    assert "Download into" in str(info.value) and "retry while online" in str(info.value)
    cache = isolated["cache"] / "cifar10"
    assert not cache.exists() or list(cache.iterdir()) == []


def test_unreachable_url_is_reported(isolated):
    with pytest.raises(DatasetNotFoundError, match=r"missing\.tar\.gz"):
        load_cifar("cifar100", "test")


# ---------------------------------------------------------------------------
# malformed files and arguments
# ---------------------------------------------------------------------------


def corrupt(batch_edit=None, raw: bytes | None = None):
    batches = make_batches("cifar10", SIZES)
    if batch_edit:
        batch_edit(batches["test"][0])
    files = member_bytes("cifar10", batches)
    if raw is not None:
        files["cifar-10-batches-py/test_batch"] = raw
    return files


@pytest.mark.parametrize(
    "files, match",
    [
        (corrupt(lambda b: b.update({b"data": b[b"data"][:, :100]})), r"shape \(N, 3072\)"),
        (corrupt(lambda b: b.update({b"labels": b[b"labels"][:-1]})), "2 images but labels of shape"),
        (corrupt(lambda b: b.update({b"labels": [10, 0]})), r"labels outside \[0, 10\)"),
        (corrupt(lambda b: b.pop(b"labels")), "missing key"),
        (corrupt(raw=b"cos\nsystem\n(S'echo pwned'\ntR."), "refusing to load global os.system"),
        (corrupt(raw=b"\x80\x02]q\x00."), "expected a pickled dict"),
        (corrupt(raw=b"garbage"), "not a readable CIFAR batch"),
    ],
    ids=["short-rows", "label-count", "label-range", "no-labels", "evil-global", "not-dict", "garbage"],
)
@pytest.mark.parametrize("kind", ["folder", "archive"])
def test_malformed_members(tmp_path, isolated, files, match, kind):
    if kind == "archive":
        write_archive(tmp_path, "cifar10", None, files=files)
    else:
        for rel, data in files.items():
            (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
            (tmp_path / rel).write_bytes(data)
    with pytest.raises(CifarFormatError, match=match):
        load_cifar("cifar10", "test", data_dir=tmp_path, download=False)


def test_malformed_archives(tmp_path, isolated):
    (tmp_path / "cifar-10-python.tar.gz").write_bytes(b"\x1f\x8b\x08 truncated")
    with pytest.raises(CifarFormatError, match="not a readable .tar.gz"):
        load_cifar("cifar10", "train", data_dir=tmp_path, download=False)
    files = member_bytes("cifar10", make_batches("cifar10", SIZES))
    del files["cifar-10-batches-py/data_batch_5"]
    write_archive(tmp_path, "cifar10", None, files=files)
    with pytest.raises(CifarFormatError, match="lacks member.*data_batch_5"):
        load_cifar("cifar10", "train", data_dir=tmp_path, download=False)


def test_invalid_arguments(isolated):
    with pytest.raises(ValueError, match="unknown dataset 'cifar-10'"):
        load_cifar("cifar-10", "train")
    with pytest.raises(ValueError, match="unknown split 'valid'"):
        load_cifar("cifar10", "valid")


# ---------------------------------------------------------------------------
# the per-process cache
# ---------------------------------------------------------------------------


def test_parse_cache_and_fresh_tensors(tmp_path, isolated, monkeypatch):
    batches = make_batches("cifar10", SIZES)
    archive = write_archive(tmp_path, "cifar10", batches)
    calls = []
    real = cifar_mod._read_archive
    monkeypatch.setattr(cifar_mod, "_read_archive", lambda *a: calls.append(a) or real(*a))

    first = load_cifar("cifar10", "train", data_dir=tmp_path)
    first[0].zero_()
    first[1].fill_(-1)
    second = load_cifar("cifar10", "train", data_dir=tmp_path)
    assert len(calls) == 1  # parsed once
    assert_loaded(second, expected(batches, "cifar10", "train"))  # unharmed by the edits

    other = make_batches("cifar10", {"train": 4, "test": 2}, seed=9)
    write_archive(tmp_path, "cifar10", other)  # replaced: different size and mtime
    os.utime(archive, ns=(archive.stat().st_mtime_ns + 10**9,) * 2)
    assert_loaded(load_cifar("cifar10", "train", data_dir=tmp_path), expected(other, "cifar10", "train"))
    assert len(calls) == 2


# ---------------------------------------------------------------------------
# the real data, when present
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", CIFAR_DATASETS)
def test_real_cifar(name):
    try:
        train_x, train_y = load_cifar(name, "train", download=False)
        test_x, test_y = load_cifar(name, "test", download=False)
    except DatasetNotFoundError:
        pytest.skip(f"{name} is not on this machine")
    classes = LAYOUT[name][3]
    assert train_x.shape == (50000, 3, 32, 32) and test_x.shape == (10000, 3, 32, 32)
    assert torch.equal(torch.bincount(train_y, minlength=classes), torch.full((classes,), 50000 // classes))
    assert torch.equal(torch.bincount(test_y, minlength=classes), torch.full((classes,), 10000 // classes))
