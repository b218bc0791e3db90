"""Units of a claim, never silently mixed: spellings of one unit become one ("X", "×" -> "x"), a variant that is
none of them is refused, and a fraction of 1 (`gl.mfu`'s 0.45) meets a percent band as 45%."""
from __future__ import annotations

from typing import Any

SPELLINGS = {"X": "x", "×": "x", "times": "x", "percent": "%", "pct": "%"}
KNOWN = ("x", "%", "% gain")  # the units a verdict formats itself; any other word is a count's unit ("kernels")


class Share(float):
    """A fraction of 1 (0.45 = 45%), as `gl.mfu` returns it: a claim in percent converts it."""


def normalise_unit(unit: Any, text: str = "") -> str:
    """The unit in its one spelling; ValueError naming the allowed ones for a variant of "x" or "%"."""
    if not isinstance(unit, str):
        raise ValueError(f"Claim {text!r}: unit={unit!r} must be text, e.g. {', '.join(map(repr, KNOWN))} or a "
                         "count's unit such as 'kernels'")
    u = SPELLINGS.get(unit.strip(), unit.strip())
    variant = "%" in u or u[:1].isdigit() or u.lower().startswith(("x ", "× "))
    if variant and u not in KNOWN:
        raise ValueError(f"Claim {text!r}: unit={unit!r} is not a unit gpulab knows; allowed: "
                         f"{', '.join(map(repr, KNOWN))} (also spelled X, ×, times, percent), or a count's unit "
                         "such as 'kernels'")
    return u


def as_claim_unit(measured: Any, interval: Any, unit: str) -> tuple[Any, Any, str]:
    """(measured, interval, note) in the claim's unit: a `Share` (`gl.mfu`'s fraction) against a "%" band is
    multiplied by 100, and the note says so. (A plain number is taken as given: a CPU's MFU is rightly 0.3%.)"""
    if unit != "%" or isinstance(measured, bool):
        return measured, interval, ""
    if isinstance(measured, Share):
        scaled = None if interval is None else (100 * interval[0], 100 * interval[1])
        return 100 * float(measured), scaled, "measured as a fraction (gl.mfu), shown in percent"
    return measured, interval, ""
