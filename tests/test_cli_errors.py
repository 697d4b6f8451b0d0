"""Every user error ends with exit 2 and a line naming the problem, before a run directory is created; no traceback
unless --debug. The data is a small synthetic FashionMNIST in a folder of its own, so that nothing else is read."""

from __future__ import annotations

import gzip
import json

import pytest
from tests.data.test_images import FILES, write_dataset

from bayesadmm import cli
from bayesadmm.experiments.config import ConfigError, resolve


def _run(capsys, *args: str) -> tuple[int, str]:
    code = cli.main(["run", *args, "--quiet"])
    return code, capsys.readouterr().err


@pytest.mark.parametrize(
    "override, message",
    [
        ("alpha1=0", "alpha1 must be a finite number > 0, got 0.0"),
        ("alpha2=inf", "alpha2 must be a finite number > 0"),
        ("lr=nan", "lr must be a number, got nan"),
        ("epochs=0", "epochs must be > 0, got 0"),
        ("seed=-1", "seed must be an integer >= 0 (the seed every random stream derives from), got -1"),
        ("cohort=-2", "cohort must be an integer >= 0 (0: automatic, 1: one client at a time), got -2"),
        ("clients=1000", "cannot give 1000 clients at least one example each"),
        ("partition=bogus", "unknown partition 'bogus'; valid: iid,"),
        ("model=bogus", "unknown model 'bogus'; valid: mlp,"),
        ("dataset=svhn", "unknown dataset 'svhn'; valid: fashion-mnist,"),
        ("model=resnet20", "model 'resnet20' does not take fashion-mnist inputs of shape (28, 28)"),
        ("epochs=2.5", "epochs must be int, got '2.5'"),
        ("epochs=2.5e0", "epochs must be int, got '2.5e0'"),
        ("per_class=0", "per_class must be >= 1, got 0"),
        ("beta2=2", "beta2 must lie in [0, 1), got 2.0"),
        ("clip_radius=0", "clip_radius must be > 0"),
        ("rho=inf", "need finite rho > 0"),
        ("likelihood=bogus", "unknown likelihood 'bogus'; valid: classification, gaussian"),
        ("likelihood=gaussian", "likelihood gaussian needs noise: set it as likelihood.noise=VALUE"),
        ("likelihood.bins=0", "likelihood classification: bins must be a positive integer, got 0"),
        ("noise=0.5", "unknown key 'noise': a setting of likelihood gaussian, not of this run's classification; "
                      "set it as likelihood=gaussian likelihood.noise=VALUE"),
        ("lrr=0.1", "unknown key 'lrr' (did you mean lr?); valid keys:"),
        ("method=ama", "ama has no preset for scenario fmnist-heterog10 (it has presets for diabetes-iid5); set its "
                       "hyperparameters explicitly: batch_size=VALUE delta=VALUE epochs=VALUE lr=VALUE rho=VALUE"),
    ],
)
def test_a_bad_setting_is_exit_2_before_the_run_directory(tmp_path, capsys, data_dir, override, message):
    out = tmp_path / "run"
    code, err = _run(capsys, "fmnist-heterog10", "rounds=1", override, f"out={out}", f"--data-dir={data_dir}")
    assert code == 2, err
    assert message in err and "Traceback" not in err
    assert len(err.strip().splitlines()) <= 2
    assert not out.exists()  # nothing created


def test_an_integer_written_as_a_float_is_read_exactly():
    config, _ = resolve("fmnist-heterog10", ["rounds=1e1", "epochs=2.0"])
    assert config.rounds == 10 and config.hparams["epochs"] == 2
    with pytest.raises(ConfigError, match="rounds must be int"):
        resolve("fmnist-heterog10", ["rounds=1.55e1"])


@pytest.mark.parametrize(
    "text, message",
    [
        ("[1, 2]", "holds a JSON list; a config file is one object"),
        ('{"method": "fedavg", "hparams": [1]}', '"hparams" in'),
        ('{"methods": {"fedavg": 3}}', '"methods" in'),
        ("{", "is not valid JSON"),
        ('{"method": "fedavg", "rounds": 0}', "rounds must be an integer >= 1 (the communication rounds), got 0"),
    ],
)
def test_a_bad_config_file_is_exit_2(tmp_path, capsys, text, message):
    path = tmp_path / "bad.json"
    path.write_text(text)
    code, err = _run(capsys, str(path))
    assert code == 2 and message in err and "Traceback" not in err


@pytest.mark.parametrize("damage", ["labels", "truncated"])
def test_a_bad_data_file_is_exit_2_naming_it(tmp_path, capsys, damage):
    folder = tmp_path / "data"
    write_dataset(folder, n_train=200, n_test=40)
    if damage == "labels":
        path = folder / (FILES["train"][1] + ".gz")
        raw = bytearray(gzip.decompress(path.read_bytes()))
        raw[8] = 42  # the first label: IDX1 has an 8-byte header
        path.write_bytes(gzip.compress(bytes(raw)))
        expected = "labels must be class numbers 0..9, found 42"
    else:
        path = folder / (FILES["test"][0] + ".gz")
        path.write_bytes(gzip.compress(gzip.decompress(path.read_bytes())[:500]))
        expected = "but the file holds"
    out = tmp_path / "run"
    code, err = _run(capsys, "fmnist-heterog10", "rounds=1", f"out={out}", f"--data-dir={folder}")
    assert code == 2 and expected in err and path.name in err and "Traceback" not in err
    assert not out.exists()


def test_a_bad_run_directory_is_exit_2(tmp_path, capsys, data_dir):
    out = tmp_path / "run"
    assert _run(capsys, "fmnist-heterog10", "method=fedavg", "rounds=1", f"out={out}", f"--data-dir={data_dir}")[0] == 0
    checkpoint = out / "checkpoint.pt"
    checkpoint.write_bytes(checkpoint.read_bytes()[:100])
    code = cli.main(["resume", str(out), "--quiet"])
    err = capsys.readouterr().err
    assert code == 2 and "checkpoint.pt is not a readable bayesadmm state file" in err and "--overwrite" in err
    (out / "config.json").write_text(json.dumps({"rounds": 1, "colour": "blue"}))
    code = cli.main(["resume", str(out), "--quiet"])
    err = capsys.readouterr().err
    assert code == 2 and "is not a bayesadmm run configuration (unexpected: colour)" in err


def test_debug_shows_the_traceback(tmp_path, data_dir):
    with pytest.raises(ValueError, match="cannot give 1000 clients"):
        cli.main(["run", "fmnist-heterog10", "clients=1000", f"--data-dir={data_dir}", "--debug", "--quiet"])


@pytest.mark.parametrize(
    "args",
    [
        ["run", "no-such-scenario", "--quiet", "seed=1", "--overwrite"],
        ["sweep", "no-such-scenario", "--out", "OUT", "seed=0:3", "--quiet"],
        ["tune", "no-such-scenario", "--out", "OUT", "method=fedavg", "--trials", "2"],
    ],
)
def test_options_may_come_among_the_key_value_arguments(tmp_path, capsys, args):
    """`bayesadmm sweep @NAME --out DIR seed=0:3 --quiet` reads seed=0:3 as an axis (argparse alone stops at it with
    "unrecognized arguments"); each command here stops at its scenario, after its arguments were read."""
    out = tmp_path / "out"
    code = cli.main([str(out) if a == "OUT" else a for a in args])
    err = capsys.readouterr().err
    assert code == 2 and "no-such-scenario" in err and "unrecognized arguments" not in err
    assert not out.exists()
