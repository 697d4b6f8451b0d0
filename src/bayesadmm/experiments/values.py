"""Typed values of a run's configuration: a KEY=VALUE string or a JSON value converted to the type its setting
declares (`convert`), the error a value the run cannot start from raises (`ConfigError`), and the one wording of
every refusal of an unknown name or key, with the nearest valid one (`unknown`)."""

from __future__ import annotations

import difflib
import inspect
import math
from collections.abc import Iterable


class ConfigError(ValueError):
    """A configuration the run cannot start from; the message says what is wrong and what is valid."""


def kinds(param: inspect.Parameter, value) -> tuple[type, ...]:
    """The accepted types, in the order given by the annotation (a string under postponed evaluation), else the
    default's type: `float | str` accepts a number first and a word otherwise (e.g. FedLap's rho = 0.1 or "size")."""
    text = param.annotation if isinstance(param.annotation, str) else getattr(param.annotation, "__name__", "")
    names = {"bool": bool, "int": int, "float": float, "str": str}
    kinds = tuple(names[part.strip()] for part in str(text).split("|") if part.strip() in names)
    if kinds:
        return kinds
    if param.default is not inspect.Parameter.empty and param.default is not None:
        return (type(param.default),)
    return (type(value),) if value is not None else (float,)


def _convert_one(key: str, value, kind: type):
    if isinstance(value, str):
        if kind is bool:
            if value.lower() in ("1", "true", "yes", "on"):
                return True
            if value.lower() in ("0", "false", "no", "off"):
                return False
            raise ConfigError(f"{key} must be true or false, got {value!r}")
        try:
            number = kind(value)
        except ValueError:
            number = _integral(value) if kind is int else None  # "1e3" and "2.0" are integers; "2.5e0" is not
            if number is None:
                raise ConfigError(f"{key} must be {kind.__name__}, got {value!r}") from None
        value = number
    if kind is float and isinstance(value, float) and math.isnan(value):
        raise ConfigError(f"{key} must be a number, got nan")
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if kind is int and isinstance(value, float) and value.is_integer():
        return int(value)
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise ConfigError(f"{key} must be {kind.__name__}, got {value!r}")
    return value


def _integral(text: str) -> int | None:
    try:
        number = float(text)
    except ValueError:
        return None
    return int(number) if number.is_integer() else None


def convert(key: str, value, kinds: tuple[type, ...]):
    errors = []
    for kind in kinds:
        try:
            return _convert_one(key, value, kind)
        except ConfigError as exc:
            errors.append(str(exc))
    raise ConfigError(errors[0] if len(errors) == 1 else f"{key}: " + "; or ".join(errors))


def suggestion(name: str, valid: Iterable[str], spelt: str = "{}") -> str:
    """``" (did you mean X?)"`` for the valid name closest to `name` (difflib's ratio ≥ 0.6), else ``""``; `spelt`
    formats the name shown (e.g. "likelihood.{}": the names are compared without the prefix they share)."""
    close = difflib.get_close_matches(str(name), [str(v) for v in valid], n=1)
    return f" (did you mean {spelt.format(close[0])}?)" if close else ""


def unknown(
    what: str,
    names: Iterable[str],
    valid: Iterable[str],
    *,
    listed: str = "valid",
    quote: bool = False,
    where: str = "",
    spelt: str = "{}",
) -> str:
    """The one-line refusal of unknown names: ``"{what} lrr (did you mean lr?){where}; valid: lr, epochs"``, each
    name with the nearest valid one where one is near; every name shown as `spelt` formats it (`quote`: the unknown
    ones as their repr); `listed` heads the list of valid names ("(none)" where there are none)."""
    valid = [str(v) for v in valid]
    shown = ", ".join(
        (repr(spelt.format(name)) if quote else spelt.format(name)) + suggestion(name, valid, spelt) for name in names
    )
    return f"{what} {shown}{where}; {listed}: {', '.join(spelt.format(v) for v in valid) or '(none)'}"
