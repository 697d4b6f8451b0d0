"""`DPSettings`: a run's differential-privacy settings, checked where they are made."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["DPSettings", "LEVELS", "ACCOUNTANTS"]

LEVELS = ("client", "example")
ACCOUNTANTS = ("rdp", "prv")  # Opacus's accountants that `get_epsilon` and `get_noise_multiplier` both take


@dataclass(frozen=True)
class DPSettings:
    """Differential privacy of a run (docs/guides/privacy.md).

    `level`: "client" (user-level DP of the server's sum: each client's update clipped to L2 norm `clip`, Gaussian
    noise of standard deviation `noise_multiplier`·`clip` added to their sum, accounted over rounds and client
    sampling) or "example" (DP-Adam, DP-IVON: per-example clipping and noise in the local training,
    `example_level`; the clip then bounds each example's gradient).
    `precision_clip`: for a Bayesian method's natural-parameter update (IVON-ADMM, IVON-PVI at level "client"), the
    bound of its precision half, `clip` then bounding its mean half taken as the precision-weighted change of the
    mean: the update is clipped into the ellipsoid of these two radii and each half gets noise σ times its radius
    (`privacy.client_level`); None: one ball of radius `clip` for the whole update.
    `noise_multiplier`: σ; None: calibrated by the accountant so that the run's rounds spend at most `epsilon`.
    `epsilon`: the budget ε (None: none, the run only reports the ε it spends); the run stops before the round that
    would exceed it. `delta`: the δ of (ε, δ)-DP. `accountant`: Opacus's "rdp" (default) or "prv"."""

    level: str = "client"
    clip: float = 1.0
    noise_multiplier: float | None = None
    epsilon: float | None = None
    delta: float = 1e-5
    accountant: str = "rdp"
    precision_clip: float | None = None

    def __post_init__(self) -> None:
        if self.level not in LEVELS:
            raise ValueError(f"dp level must be one of {', '.join(LEVELS)}, got {self.level!r}")
        if self.accountant not in ACCOUNTANTS:
            raise ValueError(f"dp accountant must be one of {', '.join(ACCOUNTANTS)}, got {self.accountant!r}")
        if not _number(self.clip) or not 0 < self.clip < math.inf:
            raise ValueError(f"dp clip must be a finite number > 0 (the L2 bound of an update), got {self.clip!r}")
        bound = self.precision_clip
        if bound is not None and not (_number(bound) and 0 < bound < math.inf):
            raise ValueError(
                f"dp precision_clip must be a finite number > 0 (the L2 bound of an update's precision half) or None, "
                f"got {self.precision_clip!r}"
            )
        if self.precision_clip is not None and self.level != "client":
            raise ValueError("dp precision_clip bounds a client's update: it needs level='client'")
        if self.noise_multiplier is not None and not (
            _number(self.noise_multiplier) and 0 <= self.noise_multiplier < math.inf
        ):
            raise ValueError(f"dp noise_multiplier must be a finite number >= 0, got {self.noise_multiplier!r}")
        if self.epsilon is not None and not (_number(self.epsilon) and 0 < self.epsilon < math.inf):
            raise ValueError(f"dp epsilon must be a finite number > 0 (the budget), got {self.epsilon!r}")
        if not _number(self.delta) or not 0 < self.delta < 1:
            raise ValueError(f"dp delta must be in (0, 1), got {self.delta!r}")
        if self.noise_multiplier is None and self.epsilon is None:
            raise ValueError("dp needs a noise_multiplier or a target epsilon (from which the noise is calibrated)")

    @classmethod
    def from_json(cls, record: object) -> DPSettings:
        """The settings `to_json` recorded; a ValueError naming what is wrong with a record of another shape (not a
        table, a key missing) or with its values."""
        keys = ("level", "clip", "dp_noise", "dp_epsilon", "delta")
        if not isinstance(record, Mapping):
            raise ValueError(f"a dp record is a table of {', '.join(keys)}, got {type(record).__name__} {record!r:.60}")
        missing = [key for key in keys if key not in record]
        if missing:
            raise ValueError(f"the dp record has no {', '.join(missing)} (it needs {', '.join(keys)})")
        return cls(
            level=record["level"],
            clip=record["clip"],
            noise_multiplier=record["dp_noise"],
            epsilon=record["dp_epsilon"],
            delta=record["delta"],
            accountant=record.get("accountant", "rdp"),
            precision_clip=record.get("precision_clip"),
        )

    def to_json(self) -> dict:
        """The settings as the run's configuration records them. The budget and the noise are named as the command
        line's keys, `dp_epsilon` and `dp_noise`, the names a resume may change (`engine.identity.RESUME_MAY_CHANGE`
        skips them by name at any depth of the configuration)."""
        return {
            "level": self.level,
            "clip": self.clip,
            "dp_noise": self.noise_multiplier,
            "dp_epsilon": self.epsilon,
            "delta": self.delta,
            "accountant": self.accountant,
        } | ({} if self.precision_clip is None else {"precision_clip": self.precision_clip})


def _number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)
