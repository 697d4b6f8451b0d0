"""Every scenario preset runs end to end for two rounds on a small slice.

MNIST and CIFAR need a download, so the test writes small synthetic files in their real formats (IDX,
pickled CIFAR batches) into a data directory: the loaders, partitions, models and algorithms all run as they would
on the real data, and a user with the data only drops `data_dir`.
"""

import json
import pickle
import struct
from pathlib import Path

import numpy as np
import pytest

from bayesadmm.algorithms import specs
from bayesadmm.cli import main
from bayesadmm.experiments.scenario_data import presets_of


def _write_idx(path: Path, array: np.ndarray) -> None:
    code = {np.uint8: 0x08}[array.dtype.type]
    header = struct.pack(">HBB", 0, code, array.ndim) + struct.pack(f">{array.ndim}I", *array.shape)
    path.write_bytes(header + array.astype(">u1").tobytes())


def _fake_mnist(root: Path, train: int, test: int) -> None:
    rng = np.random.default_rng(0)
    folder = root / "mnist"
    folder.mkdir(parents=True)
    for prefix, n in (("train", train), ("t10k", test)):
        labels = np.arange(n, dtype=np.uint8) % 10
        images = rng.integers(0, 256, size=(n, 28, 28), dtype=np.uint8)
        _write_idx(folder / f"{prefix}-images-idx3-ubyte", images)
        _write_idx(folder / f"{prefix}-labels-idx1-ubyte", labels)


def _fake_cifar(root: Path, name: str, train: int, test: int) -> None:
    rng = np.random.default_rng(1)
    classes, folder, label_key = ((10, "cifar-10-batches-py", b"labels") if name == "cifar10"
                                  else (100, "cifar-100-python", b"fine_labels"))
    directory = root / name / folder
    directory.mkdir(parents=True)

    def batch(n):
        return {b"data": rng.integers(0, 256, size=(n, 3072), dtype=np.uint8),
                label_key: [int(i % classes) for i in range(n)]}

    if name == "cifar10":
        for i in range(1, 6):
            (directory / f"data_batch_{i}").write_bytes(pickle.dumps(batch(train // 5)))
        (directory / "test_batch").write_bytes(pickle.dumps(batch(test)))
    else:
        (directory / "train").write_bytes(pickle.dumps(batch(train)))
        (directory / "test").write_bytes(pickle.dumps(batch(test)))


SMALL = ["rounds=2", "epochs=1", "eval_samples=2", "--quiet"]


@pytest.mark.parametrize("scenario, method, extra", [
    ("mnist-heterog100", "ivon-admm", ["clients=10"]),          # 10 clients x 2 shards x 300 = 6000 examples
    ("mnist-heterog100", "feddyn", ["clients=10"]),
    ("cifar10-zenke", "ivon-admm", ["clients=3"]),
    ("cifar10-acar", "fedavg", ["clients=3"]),
    ("cifar100-resnet20", "ivon-admm", ["clients=3", "batch_size=16"]),
])
def test_preset_runs_two_rounds(tmp_path, scenario, method, extra):
    data = tmp_path / "data"
    if scenario.startswith("mnist"):
        _fake_mnist(data, train=6000, test=200)
    else:
        _fake_cifar(data, "cifar100" if "100" in scenario else "cifar10", train=150, test=40)
    out = tmp_path / "run"
    code = main(["run", scenario, f"method={method}", "--data-dir", str(data), f"out={out}", *extra, *SMALL])
    assert code == 0
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [line["round"] for line in lines] == [1, 2]
    assert all(0.0 <= line["test_acc"] <= 1.0 for line in lines)
    config = json.loads((out / "config.json").read_text())
    assert config["scenario"] == scenario and config["method"] == method


DIABETES_METHODS = [spec.name for spec in specs() if "diabetes-iid5" in presets_of(spec)]


@pytest.mark.parametrize("method", DIABETES_METHODS)
def test_the_diabetes_preset_runs_two_rounds_with_each_of_its_methods(tmp_path, method):
    pytest.importorskip("sklearn")  # the data set is scikit-learn's, bundled with it: no data_dir
    out = tmp_path / "run"
    fast = ["server_iterations=50"] if method == "fedlap-func" else []  # its server fit: 5000 Adam steps a round
    assert main(["run", "diabetes-iid5", f"method={method}", f"out={out}", "workers=1", *fast, *SMALL]) == 0
    lines = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [line["round"] for line in lines] == [1, 2]
    assert all(0.0 < line["test_rmse"] < 10.0 and "test_acc" not in line for line in lines)
    config = json.loads((out / "config.json").read_text())
    assert (config["likelihood"], config["likelihood_params"]) == ("gaussian", {"noise": 0.7})
