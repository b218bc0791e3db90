"""Argument checks shared by the library: each error names the parameter, the value and what is allowed.

NaN slips through `x <= 0` (every comparison with NaN is False) and a bool passes as an int; these checks
refuse both, so a bad value fails before any work starts instead of busy-looping or hiding in a note.
"""
from __future__ import annotations

import inspect
import math
from typing import Any, Iterable


def _is_real(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def positive_float(name: str, value: Any, *, allow_none: bool = False, allow_zero: bool = False) -> float | None:
    """Return `value` as a float if it is a finite number > 0 (>= 0 with `allow_zero`); else raise ValueError."""
    if value is None and allow_none:
        return None
    bound = ">= 0" if allow_zero else "> 0"
    if not _is_real(value) or not math.isfinite(value) or value < 0 or (value == 0 and not allow_zero):
        extra = " (or None)" if allow_none else ""
        raise ValueError(f"{name}={value!r} must be a finite number {bound}{extra}")
    return float(value)


def positive_int(name: str, value: Any, *, allow_none: bool = False, minimum: int = 1) -> int | None:
    """Return `value` if it is an int >= `minimum` (not a bool, not a float like 1.5); else raise ValueError."""
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        extra = " (or None)" if allow_none else ""
        raise ValueError(f"{name}={value!r} must be an int >= {minimum}{extra}")
    return value


def choice(name: str, value: Any, allowed: Iterable[Any]) -> Any:
    """Return `value` if it is one of `allowed`; else raise ValueError listing them."""
    allowed = tuple(allowed)
    if not any(value == a and type(value) is type(a) for a in allowed):
        raise ValueError(f"{name}={value!r} is not allowed; allowed: {', '.join(repr(a) for a in allowed)}")
    return value


def sequence_of(name: str, value: Any, check, *, allow_none: bool = False) -> list | None:
    """Return `value` as a list if it is a list or tuple (not a str) whose items pass `check(item_name, item)`."""
    if value is None and allow_none:
        return None
    if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple)) or not value:
        extra = " (or None)" if allow_none else ""
        raise ValueError(f"{name}={value!r} must be a non-empty list{extra}")
    return [check(f"{name}[{i}]", v) for i, v in enumerate(value)]


def timeable_result(result: Any, name: str = "fn") -> None:
    """Refuse a call whose result is a generator or coroutine (`lambda: gen()`): its body never ran."""
    if inspect.isgenerator(result) or inspect.iscoroutine(result) or inspect.isasyncgen(result):
        getattr(result, "close", lambda: None)()  # no "coroutine was never awaited" warning besides
        raise ValueError(f"{name} returns a generator or coroutine: calling it does not run its body, so there is "
                         "nothing to time; time the work itself, e.g. lambda: list(gen())")
