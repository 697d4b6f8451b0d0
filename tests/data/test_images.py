"""Tests for bayesadmm.data.images.

Everything except the ``real_fashion_mnist`` tests runs on small synthetic IDX
files written to tmp_path, so the suite passes on a machine without the data
and without network access (downloads go through ``file://`` mirrors).
"""

from __future__ import annotations

import gzip
import hashlib
import struct
from pathlib import Path

import numpy as np
import pytest
import torch

from bayesadmm.data import (
    DatasetNotFoundError,
    IdxFormatError,
    class_pair_split,
    downsample,
    load_image_dataset,
    read_idx,
)
from bayesadmm.data import images as images_mod

REAL_FASHION_DIR = Path("/usr/share/datasets/fashion-mnist")
FILES = {
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}

_TYPE_CODES = {np.uint8: 0x08, np.int8: 0x09, np.int16: 0x0B, np.int32: 0x0C, np.float32: 0x0D, np.float64: 0x0E}


# ---------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------


def idx_bytes(array: np.ndarray) -> bytes:
    """Serialise ``array`` in IDX format (big-endian header and data)."""
    code = _TYPE_CODES[array.dtype.type]
    header = bytes([0, 0, code, array.ndim]) + struct.pack(f">{array.ndim}I", *array.shape)
    return header + array.astype(array.dtype.newbyteorder(">")).tobytes()


def write_idx(path: Path, array: np.ndarray, gz: bool = False) -> Path:
    data = idx_bytes(array)
    if gz:
        path = path.with_name(path.name + ".gz")
        data = gzip.compress(data)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def make_split(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
    images = rng.integers(0, 256, size=(n, 28, 28), dtype=np.uint8)
    labels = rng.integers(0, 10, size=n, dtype=np.uint8)
    return images, labels


def write_dataset(directory: Path, n_train: int = 6, n_test: int = 4, gz: bool = True, seed: int = 0) -> dict:
    """Write the four standard files of a small synthetic dataset; return the arrays."""
    rng = np.random.default_rng(seed)
    out = {}
    for split, n in (("train", n_train), ("test", n_test)):
        imgs, labs = make_split(rng, n)
        write_idx(directory / FILES[split][0], imgs, gz=gz)
        write_idx(directory / FILES[split][1], labs, gz=gz)
        out[split] = (imgs, labs)
    return out


def assert_matches(loaded, expected) -> None:
    images, labels = loaded
    exp_images, exp_labels = expected
    assert images.dtype == torch.uint8 and images.shape == (len(exp_labels), 28, 28)
    assert labels.dtype == torch.int64 and labels.shape == (len(exp_labels),)
    assert torch.equal(images, torch.from_numpy(exp_images))
    assert torch.equal(labels, torch.from_numpy(exp_labels.astype(np.int64)))


@pytest.fixture
def isolated(tmp_path, monkeypatch):
    """No env var, no system dir, an empty cache under a fake HOME, offline mirrors.

    Returns the paths a test may fill: system dir, cache root (HOME) and an
    (initially empty) mirror directory served over file://.
    """
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("BAYESADMM_DATA", raising=False)
    system = tmp_path / "system" / "fashion-mnist"
    monkeypatch.setattr(images_mod, "SYSTEM_DIRS", {"fashion-mnist": (system,)})
    mirror = tmp_path / "mirror"
    mirror.mkdir()
    mirrors = {"fashion-mnist": (mirror.as_uri() + "/",), "mnist": (mirror.as_uri() + "/",)}
    monkeypatch.setattr(images_mod, "MIRRORS", mirrors)
    monkeypatch.setattr(images_mod, "CHECKSUMS", {})
    return {"home": home, "system": system, "mirror": mirror, "cache": home / ".cache" / "bayesadmm"}


# ---------------------------------------------------------------------------
# read_idx
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("gz", [False, True])
@pytest.mark.parametrize(
    "array",
    [
        np.arange(2 * 3 * 4, dtype=np.uint8).reshape(2, 3, 4),
        np.array([7, 0, 255], dtype=np.uint8),
        np.array([[-2, 3], [70000, -(2**31)]], dtype=np.int32),
        np.array([-1, 2, -300], dtype=np.int16),
        np.array([[-1, 5]], dtype=np.int8),
        np.array([1.5, -2.25, 1e30], dtype=np.float32),
        np.array([[np.pi], [-1e-300]], dtype=np.float64),
    ],
    ids=["u8-3d", "u8-1d", "i32", "i16", "i8", "f32", "f64"],
)
def test_read_idx_round_trip(tmp_path, array, gz):
    path = write_idx(tmp_path / "x-idx", array, gz=gz)
    out = read_idx(path)
    assert out.shape == array.shape
    assert out.dtype == torch.from_numpy(array).dtype
    assert torch.equal(out, torch.from_numpy(array))
    out += 1  # owns writable memory (no warning / error)


def test_read_idx_detects_gzip_by_content_not_name(tmp_path):
    array = np.arange(6, dtype=np.uint8)
    gz_without_suffix = tmp_path / "plain-name"
    gz_without_suffix.write_bytes(gzip.compress(idx_bytes(array)))
    raw_with_suffix = tmp_path / "decompressed.gz"
    raw_with_suffix.write_bytes(idx_bytes(array))
    assert torch.equal(read_idx(gz_without_suffix), torch.from_numpy(array))
    assert torch.equal(read_idx(raw_with_suffix), torch.from_numpy(array))


@pytest.mark.parametrize(
    "payload, match",
    [
        (b"\x12\x34\x08\x01" + struct.pack(">I", 1) + b"\x00", "bad IDX magic"),
        (b"<html>not found</html>", "bad IDX magic"),
        (b"\x00\x00", "too short"),
        (b"\x00\x00\x07\x01" + struct.pack(">I", 1) + b"\x00", "unknown IDX type code 0x07"),
        (b"\x00\x00\x08\x00", "0 dimensions"),
        (b"\x00\x00\x08\x03" + struct.pack(">I", 2), "truncated IDX header"),
        (b"\x00\x00\x08\x01" + struct.pack(">I", 5) + b"abc", r"declares shape \(5,\).*holds 3 data bytes"),
        (b"\x00\x00\x08\x01" + struct.pack(">I", 2) + b"abc", r"declares shape \(2,\).*holds 3 data bytes"),
        (b"\x00\x00\x0c\x01" + struct.pack(">I", 1) + b"ab", "int32"),
    ],
    ids=["magic", "html", "short", "dtype", "ndim0", "header", "truncated", "trailing", "itemsize"],
)
def test_read_idx_rejects_malformed(tmp_path, payload, match):
    path = tmp_path / "bad"
    path.write_bytes(payload)
    with pytest.raises(IdxFormatError, match=match) as info:
        read_idx(path)
    assert str(path) in str(info.value)
    assert isinstance(info.value, ValueError)


def test_read_idx_rejects_corrupt_gzip(tmp_path):
    path = tmp_path / "bad.gz"
    path.write_bytes(gzip.compress(idx_bytes(np.zeros(1000, dtype=np.uint8)))[:30])  # truncated stream
    with pytest.raises(IdxFormatError, match="corrupt gzip"):
        read_idx(path)


# ---------------------------------------------------------------------------
# load_image_dataset: search order
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("gz", [False, True])
def test_load_from_data_dir(tmp_path, isolated, gz):
    data = write_dataset(tmp_path / "data", gz=gz)
    for split in ("train", "test"):
        assert_matches(
            load_image_dataset("fashion-mnist", split, data_dir=tmp_path / "data", download=False), data[split]
        )


def test_data_dir_name_subdirectory_takes_precedence(tmp_path, isolated):
    root = tmp_path / "data"
    write_dataset(root, n_train=3, seed=1)  # e.g. some other dataset lying in the root
    data = write_dataset(root / "mnist", n_train=5, seed=2)
    assert_matches(load_image_dataset("mnist", "train", data_dir=str(root), download=False), data["train"])


def test_load_from_env_var_directory_and_subdirectory(tmp_path, isolated, monkeypatch):
    flat = write_dataset(tmp_path / "flat", seed=3)
    monkeypatch.setenv("BAYESADMM_DATA", str(tmp_path / "flat"))
    assert_matches(load_image_dataset("fashion-mnist", "test", download=False), flat["test"])

    nested = write_dataset(tmp_path / "root" / "fashion-mnist", seed=4)
    monkeypatch.setenv("BAYESADMM_DATA", str(tmp_path / "root"))
    assert_matches(load_image_dataset("fashion-mnist", "test", download=False), nested["test"])


def test_search_order(tmp_path, isolated, monkeypatch):
    """data_dir alone when given (a folder without the data is an error, not a fallback to another copy); else
    env var > system dir > cache, each tried only if earlier ones lack the split."""
    by_place = {
        "data_dir": write_dataset(tmp_path / "arg", n_train=2, seed=10),
        "env": write_dataset(tmp_path / "env", n_train=3, seed=11),
        "system": write_dataset(isolated["system"], n_train=4, seed=12),
        "cache": write_dataset(isolated["cache"] / "fashion-mnist", n_train=5, seed=13),
    }
    monkeypatch.setenv("BAYESADMM_DATA", str(tmp_path / "env"))

    def n_train(**kw):
        return load_image_dataset("fashion-mnist", "train", download=False, **kw)[1].shape[0]

    assert n_train(data_dir=tmp_path / "arg") == 2
    with pytest.raises(DatasetNotFoundError, match="nowhere  .data_dir argument"):
        n_train(data_dir=tmp_path / "nowhere")
    assert n_train() == 3
    monkeypatch.delenv("BAYESADMM_DATA")
    assert n_train() == 4
    monkeypatch.setattr(images_mod, "SYSTEM_DIRS", {})
    assert_matches(load_image_dataset("fashion-mnist", "train", download=False), by_place["cache"]["train"])


def test_split_needs_both_files_in_one_directory(tmp_path, isolated, monkeypatch):
    rng = np.random.default_rng(0)
    imgs, labs = make_split(rng, 3)
    write_idx(tmp_path / "a" / FILES["train"][0], imgs)
    write_idx(isolated["system"] / FILES["train"][1], labs)
    monkeypatch.setenv("BAYESADMM_DATA", str(tmp_path / "a"))
    with pytest.raises(DatasetNotFoundError, match="never found together"):
        load_image_dataset("fashion-mnist", "train", download=False)


def test_raw_file_preferred_over_gz(tmp_path, isolated):
    rng = np.random.default_rng(0)
    imgs, labs = make_split(rng, 3)
    write_idx(tmp_path / FILES["test"][0], imgs)
    write_idx(tmp_path / FILES["test"][1], labs)
    # A stale .gz beside the raw files is ignored (this one would not even parse).
    (tmp_path / (FILES["test"][0] + ".gz")).write_bytes(b"junk")
    assert_matches(load_image_dataset("mnist", "test", data_dir=tmp_path, download=False), (imgs, labs))


def test_invalid_arguments_and_shapes(tmp_path, isolated):
    with pytest.raises(ValueError, match="unknown dataset"):
        load_image_dataset("cifar10", "train")
    with pytest.raises(ValueError, match="unknown split"):
        load_image_dataset("mnist", "validation")
    # Images that are not 28x28.
    write_idx(tmp_path / FILES["test"][0], np.zeros((2, 14, 14), dtype=np.uint8))
    write_idx(tmp_path / FILES["test"][1], np.zeros(2, dtype=np.uint8))
    with pytest.raises(ValueError, match=r"shape \(N, 28, 28\)"):
        load_image_dataset("mnist", "test", data_dir=tmp_path, download=False)
    # Label count differs from image count.
    write_idx(tmp_path / FILES["train"][0], np.zeros((2, 28, 28), dtype=np.uint8))
    write_idx(tmp_path / FILES["train"][1], np.zeros(3, dtype=np.uint8))
    with pytest.raises(ValueError, match="2 images but .* 3 labels"):
        load_image_dataset("mnist", "train", data_dir=tmp_path, download=False)


# ---------------------------------------------------------------------------
# load_image_dataset: errors and download
# ---------------------------------------------------------------------------


def test_missing_everything_without_download(tmp_path, isolated, monkeypatch):
    monkeypatch.setenv("BAYESADMM_DATA", str(tmp_path / "mine"))
    with pytest.raises(DatasetNotFoundError) as info:
        load_image_dataset("fashion-mnist", "train", download=False)
    err = info.value
    assert isinstance(err, FileNotFoundError)
    msg = str(err)
    assert "fashion-mnist" in msg
    for name in FILES["train"]:
        assert name in msg
    for place in (
        tmp_path / "mine",
        tmp_path / "mine" / "fashion-mnist",
        isolated["system"],
        isolated["cache"] / "fashion-mnist",
    ):
        assert str(place) in msg
    assert "BAYESADMM_DATA" in msg
    assert "apt-get install dataset-fashion-mnist" in msg
    assert "download=False" in msg and "download=True" in msg
    assert "/usr/share/datasets/fashion-mnist" in msg  # where the package installs, whatever SYSTEM_DIRS says
    assert err.dataset == "fashion-mnist" and err.split == "train"
    assert err.missing == FILES["train"]
    assert isolated["system"] in err.searched


def test_not_found_message_for_mnist_has_no_apt_hint(isolated, monkeypatch, tmp_path):
    monkeypatch.setenv("BAYESADMM_DATA", str(tmp_path / "env"))
    with pytest.raises(DatasetNotFoundError) as info:
        load_image_dataset("mnist", "test", download=False)
    msg = str(info.value)
    assert "apt-get" not in msg
    assert str(tmp_path / "env" / "mnist") in msg and str(tmp_path / "env") in msg
    assert "t10k-images-idx3-ubyte" in msg


def test_download_via_file_mirror(tmp_path, isolated, monkeypatch):
    data = write_dataset(isolated["mirror"], gz=True)
    # The first mirror is down; the second one serves the files.
    dead = (tmp_path / "dead").as_uri() + "/"
    monkeypatch.setattr(images_mod, "MIRRORS", {"fashion-mnist": (dead, isolated["mirror"].as_uri() + "/")})
    sums = {p.name: hashlib.md5(p.read_bytes()).hexdigest() for p in isolated["mirror"].iterdir()}
    monkeypatch.setattr(images_mod, "CHECKSUMS", {"fashion-mnist": sums})

    assert_matches(load_image_dataset("fashion-mnist", "test"), data["test"])
    cache = isolated["cache"] / "fashion-mnist"
    # Only the requested split was fetched, under its real name, with no temp files left.
    assert sorted(p.name for p in cache.iterdir()) == sorted(f + ".gz" for f in FILES["test"])

    # Now it comes from the cache, even with download=False and the mirrors gone.
    monkeypatch.setattr(images_mod, "MIRRORS", {"fashion-mnist": ()})
    assert_matches(load_image_dataset("fashion-mnist", "test", download=False), data["test"])


def test_download_fetches_only_what_the_cache_lacks(isolated):
    data = write_dataset(isolated["mirror"], gz=True)
    cache = isolated["cache"] / "mnist"
    cache.mkdir(parents=True)
    images_gz = FILES["train"][0] + ".gz"
    (cache / images_gz).write_bytes((isolated["mirror"] / images_gz).read_bytes())
    (isolated["mirror"] / images_gz).unlink()  # the mirror could not serve it again
    assert_matches(load_image_dataset("mnist", "train"), data["train"])


@pytest.mark.parametrize("problem", ["checksum", "not-idx", "absent"])
def test_bad_download_is_rejected_and_leaves_no_file(isolated, monkeypatch, problem):
    write_dataset(isolated["mirror"], gz=True)
    target = isolated["mirror"] / (FILES["train"][0] + ".gz")
    if problem == "checksum":
        monkeypatch.setattr(images_mod, "CHECKSUMS", {"mnist": {target.name: "0" * 32}})
    elif problem == "not-idx":
        target.write_bytes(b"<html>503 Service Unavailable</html>")
    else:
        target.unlink()
    with pytest.raises(DatasetNotFoundError) as info:
        load_image_dataset("mnist", "train")
    msg = str(info.value)
    assert "failed" in msg and isolated["mirror"].as_uri() in msg
    expected = {"checksum": "MD5 checksum mismatch", "not-idx": "bad IDX magic", "absent": "No such file"}[problem]
    assert expected in msg
    cache = isolated["cache"] / "mnist"
    assert not cache.exists() or list(cache.iterdir()) == []


def test_repeated_loads_use_the_parse_cache_and_return_fresh_tensors(tmp_path, isolated):
    write_dataset(tmp_path, n_test=4)
    info0 = images_mod._read_idx_cached.cache_info()
    images1, labels1 = load_image_dataset("mnist", "test", data_dir=tmp_path, download=False)
    images2, labels2 = load_image_dataset("mnist", "test", data_dir=tmp_path, download=False)
    info1 = images_mod._read_idx_cached.cache_info()
    assert info1.hits - info0.hits >= 2  # second call: images and labels served from cache
    images1.zero_()
    labels1.zero_()
    images3, labels3 = load_image_dataset("mnist", "test", data_dir=tmp_path, download=False)
    assert torch.equal(images3, images2) and torch.equal(labels3, labels2)
    assert images2.abs().sum() > 0

    # A replaced file is parsed again rather than served stale.
    data = write_dataset(tmp_path, n_test=7, seed=5)
    assert_matches(load_image_dataset("mnist", "test", data_dir=tmp_path, download=False), data["test"])


# ---------------------------------------------------------------------------
# real Fashion-MNIST (skipped when the Debian package is not installed)
# ---------------------------------------------------------------------------

real_fashion_mnist = pytest.mark.skipif(
    not all(
        (REAL_FASHION_DIR / (f + ".gz")).is_file() or (REAL_FASHION_DIR / f).is_file()
        for fs in FILES.values()
        for f in fs
    ),
    reason=f"Fashion-MNIST not installed in {REAL_FASHION_DIR} (apt-get install dataset-fashion-mnist)",
)


@real_fashion_mnist
@pytest.mark.parametrize("split, n", [("train", 60000), ("test", 10000)])
def test_real_fashion_mnist(split, n):
    images, labels = load_image_dataset("fashion-mnist", split, data_dir=REAL_FASHION_DIR, download=False)
    assert images.shape == (n, 28, 28) and images.dtype == torch.uint8
    assert labels.shape == (n,) and labels.dtype == torch.int64
    # Fashion-MNIST is class-balanced: n / 10 examples of each of the 10 labels.
    assert torch.equal(torch.bincount(labels, minlength=10), torch.full((10,), n // 10))
    assert images.max() == 255 and images.min() == 0
    clients = class_pair_split(labels)
    assert [len(c) for c in clients] == [n // 5] * 5
    small = downsample(images[:100], 7)
    assert small.shape == (100, 7, 7) and small.dtype == torch.float32


@real_fashion_mnist
def test_real_fashion_mnist_found_in_system_dir(tmp_path, monkeypatch):
    # Default search (no data_dir, no env var, empty cache) finds the Debian package.
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("BAYESADMM_DATA", raising=False)
    images, labels = load_image_dataset("fashion-mnist", "test", download=False)
    assert images.shape == (10000, 28, 28) and labels.shape == (10000,)


# ---------------------------------------------------------------------------
# downsample
# ---------------------------------------------------------------------------


def test_downsample_hand_checked():
    img = torch.zeros(1, 28, 28, dtype=torch.uint8)
    img[0, 0, 0], img[0, 0, 1], img[0, 1, 0], img[0, 1, 1] = 4, 8, 0, 200
    img[0, 27, 27] = 16
    out14 = downsample(img, 14)
    assert out14.shape == (1, 14, 14) and out14.dtype == torch.float32
    assert out14[0, 0, 0] == (4 + 8 + 0 + 200) / 4  # 53.0: mean of the top-left 2x2 block
    assert out14[0, 13, 13] == 16 / 4
    assert out14.sum() == out14[0, 0, 0] + out14[0, 13, 13]
    out7 = downsample(img, 7)
    assert out7[0, 0, 0] == 212 / 16  # 13.25: mean of the top-left 4x4 block, on the 0..255 scale
    assert out7[0, 6, 6] == 1.0


def test_downsample_matches_blockwise_mean():
    x = torch.arange(3 * 28 * 28, dtype=torch.float64).reshape(3, 28, 28)
    out = downsample(x, 7, dtype=torch.float64)
    assert out.dtype == torch.float64 and out.shape == (3, 7, 7)
    for n, i, j in [(0, 0, 0), (1, 2, 5), (2, 6, 6)]:
        assert out[n, i, j] == x[n, 4 * i : 4 * i + 4, 4 * j : 4 * j + 4].mean()
    assert torch.equal(downsample(x, 28, dtype=torch.float64), x)  # size 28 is the identity
    # The overall mean is preserved by average pooling.
    assert torch.allclose(out.mean(dim=(1, 2)), x.mean(dim=(1, 2)))


def test_downsample_errors():
    x = torch.zeros(2, 28, 28, dtype=torch.uint8)
    with pytest.raises(ValueError, match="divisor of the image side 28"):
        downsample(x, 5)
    with pytest.raises(ValueError, match="divisor"):
        downsample(x, 0)
    with pytest.raises(ValueError, match=r"\(N, H, H\)"):
        downsample(x[0], 7)
    with pytest.raises(ValueError, match=r"\(N, H, H\)"):
        downsample(torch.zeros(2, 28, 14), 7)
    with pytest.raises(ValueError, match="floating"):
        downsample(x, 7, dtype=torch.int32)


# ---------------------------------------------------------------------------
# class_pair_split
# ---------------------------------------------------------------------------


def test_class_pair_split_default_pairs_partition():
    labels = torch.tensor([3, 0, 1, 9, 2, 2, 8, 5, 4, 7, 6, 1, 0, 9])
    parts = class_pair_split(labels)
    assert len(parts) == 5
    expected = [[1, 2, 11, 12], [0, 4, 5], [7, 8], [9, 10], [3, 6, 13]]
    assert [p.tolist() for p in parts] == expected
    assert all(p.dtype == torch.int64 for p in parts)
    assert sorted(torch.cat(parts).tolist()) == list(range(len(labels)))
    for k, part in enumerate(parts):
        assert set(labels[part].tolist()) <= {2 * k, 2 * k + 1}


def test_class_pair_split_custom_groups_and_exclusions():
    rng = np.random.default_rng(0)
    labels = torch.from_numpy(rng.integers(0, 10, size=500))
    groups = ((7, 1), (3,), (0, 2, 4))
    parts = class_pair_split(labels, groups)
    for group, part in zip(groups, parts, strict=True):
        assert torch.all(part[1:] > part[:-1])  # strictly increasing
        want = [i for i, y in enumerate(labels.tolist()) if y in group]
        assert part.tolist() == want
    # Labels in no group (5, 6, 8, 9) are left out; no index is shared.
    used = torch.cat(parts)
    assert len(set(used.tolist())) == len(used)
    assert not torch.isin(labels[used], torch.tensor([5, 6, 8, 9])).any()


def test_class_pair_split_errors():
    with pytest.raises(ValueError, match="more than one group"):
        class_pair_split(torch.tensor([0, 1, 2]), ((0, 1), (1, 2)))
    with pytest.raises(ValueError, match="1-D"):
        class_pair_split(torch.zeros(2, 2, dtype=torch.int64))


def test_labels_out_of_range_are_refused_naming_the_file(tmp_path, isolated):
    write_idx(tmp_path / FILES["train"][0], np.zeros((3, 28, 28), dtype=np.uint8))
    labels = write_idx(tmp_path / FILES["train"][1], np.array([1, 42, 3], dtype=np.uint8))
    with pytest.raises(ValueError, match=f"{labels.name}: labels must be class numbers 0..9, found 42"):
        load_image_dataset("mnist", "train", data_dir=tmp_path, download=False)
