"""Experiment tracking: each round's metrics line sent to TensorBoard or MLflow, as it is written to metrics.jsonl.

A tracker is a callable on the engine's metrics line (`on_round` of `bayesadmm.run` and `run_federation`) with a
`close()`; `Trackers` calls several. Both backends are optional extras (`pip install -e '.[tracking]'`) and are
imported only when a tracker is made, so the error names the extra.

- `TensorBoard(log_dir)`: one scalar per metric, the round as the step. A resumed run first drops the events of the
  rounds it will write again (`purge_step`), so the curves show each round once, as metrics.jsonl does.
- `MLflow(tracking_uri, experiment, run_name, params)`: one MLflow run per bayesadmm run, the configuration as its
  parameters and the metrics by round. Through an explicit `MlflowClient` (no process-wide MLflow state is changed).
  The MLflow run's id is kept in the run directory (mlflow-run.json), so a resume goes on logging into the same run.
  The default store is `sqlite:///<run_dir>/mlflow.db` (MLflow's file store is deprecated); point several runs at
  one store with `MLFLOW_TRACKING_URI` (e.g. `sqlite:///runs/mlflow.db`) to compare them in `mlflow ui`.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

TRACKERS = ("tensorboard", "mlflow")


def _scalars(line: Mapping[str, Any]) -> dict[str, float]:
    """The numeric, finite entries of a metrics line other than the round itself."""
    return {
        key: float(value)
        for key, value in line.items()
        if key != "round" and isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    }


def available(name: str) -> str | None:
    """None if tracker `name` can be made here, else what to install."""
    import importlib.util

    module, package = {"tensorboard": ("tensorboard", "tensorboard"), "mlflow": ("mlflow", "mlflow-skinny")}[name]
    if importlib.util.find_spec(module) is None:
        return f"log={name} needs {package}: pip install -e '.[tracking]'"
    return None


def _need(module: str, package: str):
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError:
        raise ImportError(f"{package} is not installed: pip install -e '.[tracking]'") from None


class TensorBoard:
    """Metrics as TensorBoard scalars in `log_dir` (`tensorboard --logdir <log_dir>` shows them)."""

    def __init__(self, log_dir: Path | str):
        _need("tensorboard", "tensorboard")
        self.log_dir = Path(log_dir)
        self._writer: Any = None

    def __call__(self, line: Mapping[str, Any]) -> None:
        from torch.utils.tensorboard import SummaryWriter

        step = int(line["round"])
        if self._writer is None:  # made at the first round written: a resume purges what comes after it
            self._writer = SummaryWriter(str(self.log_dir), purge_step=step)
        for key, value in _scalars(line).items():
            self._writer.add_scalar(key, value, step)
        self._writer.flush()

    def close(self, status: str = "FINISHED") -> None:
        if self._writer is not None:
            self._writer.close()


class MLflow:
    """Metrics and the configuration in an MLflow tracking store; `id_file` keeps the MLflow run's id for a resume."""

    def __init__(
        self,
        tracking_uri: str,
        experiment: str,
        run_name: str,
        params: Mapping[str, Any],
        id_file: Path | str | None = None,
    ):
        tracking = _need("mlflow.tracking", "mlflow-skinny")
        self.client = tracking.MlflowClient(tracking_uri=tracking_uri)
        self.id_file = Path(id_file) if id_file else None
        run_id = self._known_run()
        if run_id is None:
            found = self.client.get_experiment_by_name(experiment)
            experiment_id = found.experiment_id if found else self.client.create_experiment(experiment)
            run = self.client.create_run(experiment_id, run_name=run_name)
            run_id = run.info.run_id
            entities = _need("mlflow.entities", "mlflow-skinny")
            flat = [entities.Param(k, str(v)[:6000]) for k, v in _flatten(params).items()]
            for start in range(0, len(flat), 100):  # MLflow takes at most 100 parameters per batch
                self.client.log_batch(run_id, params=flat[start : start + 100])
            if self.id_file:
                self.id_file.write_text(json.dumps({"tracking_uri": tracking_uri, "run_id": run_id}) + "\n")
        self.run_id = run_id

    def _known_run(self) -> str | None:
        if self.id_file is None or not self.id_file.exists():
            return None
        return json.loads(self.id_file.read_text())["run_id"]

    def __call__(self, line: Mapping[str, Any]) -> None:
        entities = _need("mlflow.entities", "mlflow-skinny")
        step, now = int(line["round"]), _now_ms()
        metrics = [entities.Metric(key, value, now, step) for key, value in _scalars(line).items()]
        self.client.log_batch(self.run_id, metrics=metrics)

    def close(self, status: str = "FINISHED") -> None:
        self.client.set_terminated(self.run_id, status=status)


def _now_ms() -> int:
    import time

    return int(time.time() * 1000)


def _flatten(params: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in params.items():
        if isinstance(value, Mapping):
            flat.update(_flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


class Trackers:
    """Several trackers as one `on_round` callable; `close` closes each."""

    def __init__(self, trackers: Sequence[Callable[[Mapping[str, Any]], None]] = ()):
        self.trackers = list(trackers)

    def __call__(self, line: Mapping[str, Any]) -> None:
        for tracker in self.trackers:
            tracker(line)

    def close(self, status: str = "FINISHED") -> None:
        """Close each tracker; `status` is MLflow's end state of the run (FINISHED, FAILED or KILLED)."""
        for tracker in self.trackers:
            close = getattr(tracker, "close", None)
            if close is not None:
                close(status)


def for_run(names: Sequence[str], run_dir: Path, params: Mapping[str, Any], run_name: str) -> Trackers:
    """The trackers `names` (of `TRACKERS`) for a run directory: TensorBoard events in run_dir/tensorboard, MLflow in
    $MLFLOW_TRACKING_URI or run_dir/mlflow.db, in the experiment named by $MLFLOW_EXPERIMENT_NAME or "bayesadmm"."""
    unknown = sorted(set(names) - set(TRACKERS))
    if unknown:
        raise ValueError(f"unknown tracker(s) {', '.join(unknown)}; valid: {', '.join(TRACKERS)}")
    made: list[Callable[[Mapping[str, Any]], None]] = []
    if "tensorboard" in names:
        made.append(TensorBoard(run_dir / "tensorboard"))
    if "mlflow" in names:
        uri = os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{(run_dir / 'mlflow.db').resolve()}"
        experiment = os.environ.get("MLFLOW_EXPERIMENT_NAME") or "bayesadmm"
        made.append(MLflow(uri, experiment, run_name, params, id_file=run_dir / "mlflow-run.json"))
    return Trackers(made)


__all__ = ["TensorBoard", "MLflow", "Trackers", "for_run", "TRACKERS"]
