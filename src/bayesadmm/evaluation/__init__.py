"""Evaluation and reporting: what a run measures and what is made of the measurements.

``metrics`` (``evaluate``: the likelihood's metrics at the posterior mean and for the predictive;
``evaluate_uncertainty``) and ``uncertainty`` (OOD detection, selective prediction, the reliability diagram) score a
posterior; ``leavings`` writes what a run leaves in its directory when it ends (curves.png, and reliability.json and
.png for a likelihood with confidence bins); ``diagrams`` draws the reliability diagram, ``reports`` one run's curves
and ``compare``'s tables and plots, ``personal_reports`` the personalised ones, ``tables`` formats them; ``results``
reads run directories and ``runs.jsonl`` files for them; ``tracking`` sends each round's metrics to TensorBoard and
MLflow.

The package's own ``__init__`` imports nothing, so that the engine can import ``evaluation.metrics`` without the
reports' dependencies (the configuration layer, which itself builds on the engine)."""
