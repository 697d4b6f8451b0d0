"""What a resume must match: the run's identity (method, configuration, data: the clients' and what the run is scored
on) recorded in checkpoint.pt, compared with the resuming run's (`check_same_run`), except the settings a resume may
change (`RESUME_MAY_CHANGE`). A checkpoint written before the evaluation data were recorded resumes unchecked on them;
its next checkpoint records them. A run that `bayesadmm.unlearn(..., out=)` wrote without some clients records them
(the data's "unlearned"): a resume with their data is refused, and its checkpoints go on recording them
(`carried_removals`)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from torch import Tensor

from bayesadmm.algorithms import spec as method_specs
from bayesadmm.engine.rundir import RunDirError
from bayesadmm.trees import hash_tensors

__all__ = [
    "RESUME_MAY_CHANGE",
    "IMPLIED",
    "check_same_run",
    "carried_removals",
    "flat_settings",
    "completed",
    "evaluation_fingerprint",
]

# what a resume may change: where the files go, how many workers, when to checkpoint or stop, the trackers, the
# device (the numbers are those of the run's configuration, only rounded differently by another processor), and a
# Flower run config's launch flags and timeouts (its keys are spelt with '-': stop-at, round-timeout, ...), and a
# private run's budget and noise (a resume with a larger budget goes on; the accountant's history holds every round's
# noise, so ε stays exact); "unlearned", config.json's record of the clients `bayesadmm.unlearn` removed, is no
# setting a resume repeats: the checkpoint's data record them, and are checked (`check_same_run`)
RESUME_MAY_CHANGE = frozenset(
    {"out", "data_dir", "workers", "checkpoint_every", "stop_at", "log", "device", "dp_epsilon", "dp_noise"}
    | {"client_store", "unlearned"}
    | {"resume", "overwrite", "round_timeout", "discovery_timeout"}
)
# a key a configuration written before it existed leaves out, and the value that means: (key, JSON value); the
# kernels were compiled before `compile` chose (the command line's key, and bayesadmm.run's)
IMPLIED = {"dtype": json.dumps("float32"), "compile": json.dumps("on"), "settings.compile": json.dumps("on")}


def flat_settings(config: Mapping, prefix: str = "") -> dict[str, str]:
    """A configuration as flat `key: JSON value` pairs (nested tables by dotted keys), without RESUME_MAY_CHANGE."""
    flat: dict[str, str] = {}
    for key, value in config.items():
        if str(key).replace("-", "_") in RESUME_MAY_CHANGE:
            continue
        if isinstance(value, Mapping):
            flat.update(flat_settings(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = json.dumps(value, sort_keys=True)
    return flat


def check_same_run(path: Path, checkpoint: Mapping, identity: Mapping) -> None:
    """A RunDirError naming the difference if the checkpoint at `path` was written by another method, configuration
    or data than this run's `identity`."""
    saved = checkpoint.get("run")
    if not isinstance(saved, Mapping) or not {"method", "config", "data"} <= set(saved):
        raise RunDirError(f"{path} does not record its run (written by an older bayesadmm); start the run again")
    again = "resume with the run's own, or start a new run (another out=, or --overwrite)"
    if saved["method"] != identity["method"]:
        raise RunDirError(
            f"{path} is a checkpoint of method {saved['method']!r}, this run's is {identity['method']!r}; {again}"
        )
    _check_not_removed(path, saved["data"], identity["data"])  # before the configuration's table of the clients
    if isinstance(saved["config"], Mapping) and identity["config"] is not None:
        _check_same_config(path, saved["config"], identity["config"])
    _check_same_data(path, saved["data"], identity["data"])


def carried_removals(identity: Mapping, checkpoint: Mapping) -> dict:
    """`identity` (a resuming run's) with the clients the checkpoint's run records as removed (`bayesadmm.unlearn`),
    so that the run's later checkpoints record them too."""
    saved = checkpoint.get("run", {}).get("data")
    removed = saved.get("unlearned") if isinstance(saved, Mapping) else None
    if not removed:
        return dict(identity)
    return {**identity, "data": {**identity["data"], "unlearned": removed}}


def _check_not_removed(path: Path, old_data: Any, new_data: Mapping) -> None:
    """A RunDirError naming the client where the resuming run's clients include one the checkpoint's run removed."""
    removed = old_data.get("unlearned") if isinstance(old_data, Mapping) else None
    present = [k for k in removed or () if str(k) in new_data["sizes"]]
    if present:
        raise RunDirError(
            f"client {present[0]} was unlearned from the run in {path.parent} (bayesadmm.unlearn): resume it without "
            "that client's data"
        )


def completed(config: Mapping) -> dict:
    """`config` with every registered method's "hparams" table whole: the hyperparameters it leaves out at their
    defaults. A run's configuration records every hyperparameter of a registered method (`MethodSpec.resolved`); one
    written before it did recorded only those set and ran the others at their defaults, which this reads it with.
    Found wherever a table holds "hparams" beside the method's registered name ("method" or "algorithm"): the layouts
    of `bayesadmm run`, `bayesadmm.run` and the Flower apps."""
    whole = {k: completed(v) if isinstance(v, Mapping) and k != "hparams" else v for k, v in config.items()}
    name = config.get("method", config.get("algorithm"))
    if isinstance(config.get("hparams"), Mapping) and isinstance(name, str) and name in method_specs.names():
        defaults = {f.name: f.default for f in method_specs.get(name).fields() if f.default is not dataclasses.MISSING}
        whole["hparams"] = {**defaults, **config["hparams"]}
    return whole


def _check_same_config(path: Path, saved: Mapping, mine: Mapping) -> None:
    if "run" not in saved:  # written before configurations held the run's record: its other tables say the same
        mine = {k: v for k, v in mine.items() if k != "run"}
    old, new = flat_settings(completed(saved)), flat_settings(completed(mine))
    for key, value in IMPLIED.items():  # spelt out or implied: the same run
        if old.get(key, value) == new.get(key, value):
            old.pop(key, None)
            new.pop(key, None)
    differ = sorted(k for k in old.keys() | new.keys() if old.get(k) != new.get(k))
    # a difference in the run's record ("run.…") is named once: by the door's own key of the same name, if it has one
    named = {key.rsplit(".", 1)[-1] for key in differ if not key.startswith("run.")}
    differ = [key for key in differ if not key.startswith("run.") or key.rsplit(".", 1)[-1] not in named]
    if differ:
        shown = ", ".join(f"{k} {old.get(k, '(unset)')} → {new.get(k, '(unset)')}" for k in differ[:5])
        raise RunDirError(
            f"the configuration differs from the one {path} was written with ({shown}"
            f"{', ...' if len(differ) > 5 else ''}); resume with the settings it was started with (its config.json), "
            "or start a new run (another out=, or overwrite)"
        )


def _check_same_data(path: Path, old_data: Any, new_data: Mapping) -> None:
    if not isinstance(old_data, Mapping) or old_data.get("sizes") != new_data["sizes"]:
        old_sizes = old_data.get("sizes") if isinstance(old_data, Mapping) else None
        raise RunDirError(
            f"the clients differ from those {path} was written with (sizes {_short(old_sizes)} → "
            f"{_short(new_data['sizes'])}); resume with the run's own data, or start a new run"
        )
    if "sha256" in old_data and "sha256" in new_data and old_data["sha256"] != new_data["sha256"]:
        raise RunDirError(
            f"the clients' examples differ from those {path} was written with (same sizes, other values: their sha256 "
            f"differs); resume with the run's own data, or start a new run"
        )
    old_each, new_each = old_data.get("client_sha256"), new_data.get("client_sha256")
    # each client's, which is all a run without a client (`bayesadmm.unlearn(..., out=)`) records
    if isinstance(old_each, Mapping) and isinstance(new_each, Mapping):
        differ = [k for k in old_each if old_each[k] != new_each.get(k)]
        if differ:
            raise RunDirError(
                f"client {differ[0]}'s examples differ from those {path} was written with (same size, other values: "
                "their sha256 differs); resume with the run's own data, or start a new run"
            )
    if "evaluation" in new_data:
        _check_same_evaluation(path, old_data.get("evaluation"), new_data["evaluation"])


# what a run is scored on, by the name a refusal gives it
EVALUATION_DATA = {
    "test": "the evaluation set (test=)",
    "ood": "the OOD inputs (ood=)",
    "personal": "the personal test splits",
}


def evaluation_fingerprint(
    X: Tensor | None, y: Tensor | None, ood: Tensor | None, personal: Mapping[int, tuple[Tensor, Tensor]] | None
) -> dict[str, str | None]:
    """The sha256 of what a run is scored on: its evaluation set (`X`, `y`), its OOD inputs and its clients' personal
    test splits (None for what the run has not), recorded with the clients' data so that a resume scored on other
    data is refused."""

    def sha(tensors: list[Tensor]) -> str:
        return hash_tensors(hashlib.sha256(), tensors).hexdigest()

    return {
        "test": None if X is None or y is None else sha([X, y]),
        "ood": None if ood is None else sha([ood]),
        "personal": None if personal is None else sha([t for k in sorted(personal) for t in personal[k]]),
    }


def _check_same_evaluation(path: Path, old: Any, new: Mapping) -> None:
    if old is None:  # a checkpoint written before evaluation data was recorded: nothing to check it by
        return
    for key, name in EVALUATION_DATA.items():
        if isinstance(old, Mapping) and key not in old:  # not recorded (a run without a client: its personal splits)
            continue
        if not isinstance(old, Mapping) or old.get(key) != new.get(key):
            raise RunDirError(
                f"the data of {name} differ from those {path} was written with (their sha256 differs): the rounds "
                "after the resume would be scored on other data; resume with the run's own, or start a new run"
            )


def _short(sizes: Any) -> str:
    text = json.dumps(sizes)
    return text if len(text) <= 80 else text[:77] + "..."
