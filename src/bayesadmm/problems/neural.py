"""A client's classification data with a flat-parameter model: `SupervisedData` with the cross-entropy likelihood
(its default). Kept under this name for the convex-problem code and tests that build classification clients."""

from bayesadmm.clients import SupervisedData as ClassificationData

__all__ = ["ClassificationData"]
