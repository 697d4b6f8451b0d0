"""`bayesadmm methods [list | show NAME]`: every registered method listed with its summary; one method's
hyperparameters (required ones marked), presets per scenario (from the scenario files), search space and DP, as its
spec declares them."""

from __future__ import annotations

import dataclasses

from bayesadmm import cli
from bayesadmm.algorithms import get, names
from bayesadmm.experiments.scenario_data import presets_of


def test_methods_lists_every_registered_method_with_its_summary(capsys):
    assert cli.main(["methods"]) == 0
    listed = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in listed] == names()
    assert all(line.endswith(get(line.split()[0]).summary) for line in listed)
    assert cli.main(["methods", "list"]) == 0 and capsys.readouterr().out.splitlines() == listed


def test_methods_show_gives_the_hyperparameters_presets_and_search_space_of_the_spec(capsys):
    for name in names():
        assert cli.main(["methods", "show", name]) == 0
        shown = capsys.readouterr().out
        spec = get(name)
        for f in dataclasses.fields(spec.hparams):
            if not f.init:
                continue
            line = next(line for line in shown.splitlines() if line.split()[:1] == [f.name])
            required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
            assert line.endswith("required") if required else line.endswith(repr(f.default)), line
        for scenario, values in presets_of(spec).items():
            assert f"  {scenario}: " + " ".join(f"{k}={v}" for k, v in values.items()) in shown
        for key, space in spec.search_space.items():
            line = next(line for line in shown.splitlines() if line.startswith(f"  {key}: "))
            if "around" in space:  # centred on the scenario's value, and what a run without one searches
                low, high = space["around"]
                assert f"{low:g}x to {high:g}x the scenario's value" in line, line
                assert ("without a positive one: refused" in line) == (set(space) == {"around"}), line
            if "log" in space:
                assert f"log-uniform {space['log'][0]:g} to {space['log'][1]:g}" in line, line
            if "choices" in space:
                assert "one of " + ", ".join(map(str, space["choices"])) in line, line
        assert ("client-level differential privacy: yes" in shown) == (spec.dp_update is not None)


def test_methods_show_refuses_an_unknown_or_missing_name_in_one_line(capsys):
    assert cli.main(["methods", "show", "ivon-adm"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("bayesadmm: unknown method 'ivon-adm' (did you mean ivon-admm?); valid:") and "\n" not in err
    assert cli.main(["methods", "show"]) == 2
    needs = "bayesadmm: methods show needs a method's name (bayesadmm methods lists them)"
    assert capsys.readouterr().err.strip() == needs
    assert cli.main(["methods", "list", "fedavg"]) == 2
    assert "bayesadmm methods show fedavg" in capsys.readouterr().err


def test_methods_shows_a_users_own_method_from_its_file(tmp_path, capsys, monkeypatch):
    from bayesadmm.algorithms import spec

    monkeypatch.setenv(spec.ENVIRONMENT, "")  # `--methods` names its files there for the processes a command starts
    monkeypatch.setattr(spec, "_SPECS", dict(spec._SPECS))  # the method registered here stays in this test
    module = tmp_path / "my_method.py"
    module.write_text(
        "import dataclasses\n"
        "from bayesadmm.algorithms import MethodSpec, register\n"
        "@dataclasses.dataclass(frozen=True)\n"
        "class H:\n"
        "    lr: float\n"
        "    momentum: float = 0.9\n"
        "register(MethodSpec('my-fedavg-for-methods', H, lambda h, c: None, summary='mine'))\n"
    )
    assert cli.main(["methods", "show", "my-fedavg-for-methods", "--methods", str(module)]) == 0
    shown = capsys.readouterr().out
    assert shown.startswith("my-fedavg-for-methods: mine") and "momentum" in shown and "presets" in shown
