"""The parameter groups of `optim.IVON` (`optimizer.py`): their state (h, g, step, the noise stream), the checks of
their hyperparameters, the hyperparameters as the functional core takes them, their flat buffers, the conversion of
user-given vectors into per-group pieces, and checkpoints (the state lives in the groups). `IVON` adds the sampling,
the steps and the public prior, dual and posterior methods on top.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import overload

import torch
from torch import Tensor

from bayesadmm import rng
from bayesadmm.optim.flat_group import _can_share_one_buffer, _FlatGroup, _flatten
from bayesadmm.optim.ivon import IVONState
from bayesadmm.optim.ivon_terms import _check_beta, _check_positive

_Vec = Tensor | Sequence[Tensor] | float | None


class _IVONGroups(torch.optim.Optimizer):
    """The per-group half of `IVON`: everything that reads or writes one parameter group's entries."""

    noise: str  # "counter" or "torch" (IVON's constructor)
    generator: torch.Generator | None
    _flatten: bool  # give each group whose parameters can share one a flat buffer
    _flats: list[_FlatGroup | None]  # one per param group, in order

    # -- groups and their state --

    def add_param_group(self, param_group: dict) -> None:
        super().add_param_group(param_group)
        group = self.param_groups[-1]
        params = group["params"]
        if len({(p.dtype, p.device) for p in params}) != 1:
            raise ValueError("all parameters of a group must share dtype and device (they form one flat vector)")
        self._check_hyper(group)
        p0 = params[0]
        group["numel"] = sum(p.numel() for p in params)
        group["hess"] = torch.full((group["numel"],), float(group["hess_init"]), dtype=p0.dtype, device=p0.device)
        group["momentum"] = torch.zeros_like(group["hess"])
        group["step"] = 0
        if self.noise == "counter":
            # one stream per group; "draws" counts the samples taken from it (one block of `numel` draws each)
            group["noise_key"], group["draws"] = rng.stream_key(self.generator), 0
        for key in ("prior_mean", "prior_precision", "v", "u"):
            group.setdefault(key, None)
        group["_samples"] = []
        self._flats.append(_FlatGroup(params) if self._flatten and _can_share_one_buffer(params) else None)

    @staticmethod
    def _check_hyper(group: dict) -> None:
        _check_positive("lr", group["lr"])
        _check_positive("ess", group["ess"])
        _check_beta("beta1", group["beta1"])
        _check_beta("beta2", group["beta2"])
        if not group["hess_init"] >= 0:
            raise ValueError(f"hess_init must be >= 0, got {group['hess_init']}")
        wd = group["weight_decay"]
        if wd is not None and not wd >= 0:
            raise ValueError(f"weight_decay must be >= 0, got {wd}")
        if not group["clip_radius"] > 0:
            raise ValueError(f"clip_radius must be > 0, got {group['clip_radius']}")

    def _delta(self, group: dict) -> Tensor | float:
        if group["prior_precision"] is not None:
            return group["prior_precision"] / group["ess"]
        if group["weight_decay"] is None:
            raise ValueError("this group has neither a prior precision nor a weight decay")
        return float(group["weight_decay"])

    def _hyper(self, group: dict) -> dict:
        """The group's hyperparameters as the functional core's `update` and `update_terms` take them."""
        keys = ("ess", "beta1", "beta2", "prior_mean", "v", "u", "clip_radius", "debias")
        return {"lr": self._lr(group), "delta": self._delta(group), **{key: group[key] for key in keys}}

    def _lr(self, group: dict) -> Tensor | float:
        if not group["rescale_lr"]:
            return group["lr"]
        return group["lr"] * (group["hess_init"] + self._delta(group))

    def _live(self, index: int) -> _FlatGroup | None:
        """Group `index`'s flat buffer, or None where it has none or its parameters stopped viewing it (a .data was
        replaced): such a group goes on with the copying path for good, which finds the parameters where they are."""
        flat = self._flats[index] if index < len(self._flats) else None
        if flat is not None and not flat.intact(self.param_groups[index]["params"]):
            self._flats[index] = flat = None
        return flat

    def _mean(self, index: int) -> Tensor:
        """Group `index`'s parameters as one flat vector: the live buffer where there is one (not to be written),
        else a copy."""
        flat = self._live(index)
        return flat.mean if flat is not None else _flatten(self.param_groups[index]["params"])

    def _state(self, index: int) -> IVONState:
        g = self.param_groups[index]
        return IVONState(self._mean(index), g["hess"], g["momentum"], g["step"])

    @overload
    def _split(self, name: str, value: None, allow_scalar: bool = False) -> list[None]: ...
    @overload
    def _split(
        self, name: str, value: Tensor | Sequence[Tensor] | float, allow_scalar: bool = False
    ) -> list[Tensor]: ...
    @overload
    def _split(self, name: str, value: _Vec, allow_scalar: bool = False) -> list[Tensor | None]: ...
    def _split(self, name: str, value: _Vec, allow_scalar: bool = False) -> Sequence[Tensor | None]:
        """A flat vector / per-parameter tensors / (optionally) a float over all groups -> one flat tensor per group."""
        if value is None:
            return [None] * len(self.param_groups)
        params = [p for g in self.param_groups for p in g["params"]]
        p0 = params[0]
        total = sum(p.numel() for p in params)
        if not torch.is_tensor(value) and isinstance(value, (int, float)):
            if not allow_scalar:
                raise ValueError(f"{name} must be a tensor or a sequence of tensors")
            flat = torch.full((total,), float(value), dtype=p0.dtype, device=p0.device)
        elif torch.is_tensor(value):
            if tuple(value.shape) != (total,):
                raise ValueError(
                    f"{name} as a tensor must be flat with {total} entries, got shape {tuple(value.shape)}"
                )
            flat = value.detach().to(dtype=p0.dtype, device=p0.device).clone()
        else:
            value = list(value)
            if len(value) != len(params) or any(
                tuple(x.shape) != tuple(p.shape) for x, p in zip(value, params, strict=True)
            ):
                raise ValueError(
                    f"{name} as a sequence must hold one tensor shaped like each parameter, got shapes "
                    f"{[tuple(x.shape) for x in value]}"
                )
            flat = _flatten(value).to(dtype=p0.dtype, device=p0.device)
        parts: list[Tensor] = []
        offset = 0
        for g in self.param_groups:
            parts.append(flat[offset : offset + g["numel"]].clone())
            offset += g["numel"]
        return parts

    def _forget(self) -> None:
        for flat in self._flats:
            if flat is not None:
                flat.forget()

    # -- checkpoints: the state lives in the param groups --

    def state_dict(self) -> dict:
        sd = super().state_dict()
        for g in sd["param_groups"]:
            g.pop("_samples", None)  # recorded samples belong to an unfinished step
            # copies: a group with a flat buffer updates h and g in place, and a state dict is a snapshot
            g["hess"], g["momentum"] = g["hess"].clone(), g["momentum"].clone()
        return sd

    def load_state_dict(self, state_dict: dict) -> None:
        super().load_state_dict(state_dict)  # (copies the groups' tensors: ours to update in place)
        for g in self.param_groups:
            p0 = g["params"][0]
            if self.noise == "counter" and "noise_key" not in g:
                raise ValueError(
                    "this state dict is of an IVON with noise='torch'; load it into one with the same "
                    "noise, or set noise='torch'"
                )
            if g["numel"] != sum(p.numel() for p in g["params"]):
                raise ValueError("loaded state dict does not match the size of the parameters")
            for key in ("hess", "momentum", "prior_mean", "prior_precision", "v", "u"):
                if g.get(key) is not None:
                    g[key] = g[key].to(dtype=p0.dtype, device=p0.device)
            g["_samples"] = []
        self._forget()
