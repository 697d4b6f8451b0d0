"""The configuration's differential-privacy keys (`bayesadmm run ... dp=client dp_clip=... dp_epsilon=...`), read
into the `privacy.DPSettings` they describe:

    dp          "" (none, the default), "client" (client-level DP of the server's sum) or "example" (per-example
                clipping and noise in the local training: DP-Adam, DP-IVON)
    dp_clip     the L2 bound C of a client's update (of an example's gradient at dp=example)
    dp_noise    the noise multiplier σ; -1: calibrated so that the run's rounds spend dp_epsilon
    dp_epsilon  the budget ε; 0: none (the run reports the ε it spends)
    dp_delta    the δ of (ε, δ)-DP
    dp_precision_clip  the L2 bound of the precision half of IVON-ADMM's and IVON-PVI's update (dp_clip then bounds
                its mean half, `DPSettings.precision_clip`); 0: none, one clip for the whole update
"""

from __future__ import annotations

from typing import Any

from bayesadmm.privacy import DPSettings

__all__ = ["DP_DEFAULTS", "dp_settings", "dp_problems"]

# the keys' defaults, which config.json leaves out (a run without dp records none of them)
DP_DEFAULTS: dict[str, Any] = {
    "dp": "", "dp_clip": 1.0, "dp_noise": -1.0, "dp_epsilon": 0.0, "dp_delta": 1e-5, "dp_precision_clip": 0.0,
}  # fmt: skip


def dp_settings(config: Any) -> DPSettings | None:
    """The `DPSettings` of a configuration's dp keys; None where `dp` is empty. A ValueError names a bad value."""
    if not config.dp:
        return None
    return DPSettings(
        level=config.dp,
        clip=config.dp_clip,
        noise_multiplier=None if config.dp_noise == -1.0 else config.dp_noise,
        epsilon=config.dp_epsilon or None,
        delta=config.dp_delta,
        precision_clip=config.dp_precision_clip or None,
    )


def dp_problems(config: Any) -> list[str]:
    """What is wrong with the configuration's dp keys (one message, or none)."""
    try:
        dp_settings(config)
    except ValueError as exc:
        keys = "dp, dp_clip, dp_noise: -1 calibrates it, dp_epsilon: 0 for no budget, dp_delta, dp_precision_clip"
        return [f"{exc} (keys {keys})"]
    return []
