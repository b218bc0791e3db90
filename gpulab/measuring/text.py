"""Numbers and words for a reader: three significant figures with SI prefixes, one unit each, plurals right.

    from gpulab.measuring.text import si, pct, plural, ratio
    si(123_376_394_007.9, "elements/s")   # '123 Gelements/s'
    pct(0.4734)                            # '47.3%'
    plural(1, "kernel")                    # '1 kernel'
    ratio(7.891)                           # '7.89x'
"""
from __future__ import annotations

import math

_PREFIXES = [(1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k"), (1.0, ""), (1e-3, "m"), (1e-6, "µ"),
             (1e-9, "n")]


def sig(x: float, digits: int = 3) -> str:
    """`x` to `digits` significant figures, without exponent notation for everyday sizes (1,230 not 1.23e+03)."""
    if x is None or not math.isfinite(x):
        return "n/a"
    if x == 0:
        return "0"
    decimals = digits - 1 - int(math.floor(math.log10(abs(x))))
    rounded = round(x, decimals)
    if rounded and math.floor(math.log10(abs(rounded))) > math.floor(math.log10(abs(x))):
        decimals -= 1  # rounded up to the next power of ten: 99.997 -> "100", not "100.0" (four figures)
        rounded = round(x, decimals)
    return f"{rounded:,.{max(0, decimals)}f}"


def si(x: float | None, unit: str = "", digits: int = 3) -> str:
    """`x` with an SI prefix and three significant figures: si(2.5e-3, "s") -> '2.50 ms'; None -> 'n/a'."""
    if x is None or not math.isfinite(x):
        return "n/a"
    mag = abs(x)
    scale, prefix = next(((s, p) for s, p in _PREFIXES if mag >= s), _PREFIXES[-1]) if mag else (1.0, "")
    text = sig(x / scale, digits)
    return f"{text} {prefix}{unit}".rstrip() if unit or prefix else text


def si_count(x: float | None, unit: str = "") -> str:
    """A count or a tick with its SI prefix and no trailing zeros: 9 syncs read '9', 2,000 kernels '2 k',
    2.5 syncs '2.5' (si() keeps three figures: '9.00', '2.00 k')."""
    number, _, rest = si(x, unit).partition(" ")
    if "." in number:
        number = number.rstrip("0").rstrip(".")
    return f"{number} {rest}".rstrip()


def pct(x: float | None, scale: float = 100.0, digits: int = 3) -> str:
    """A fraction as a percentage (pct(0.473) -> '47.3%'); pass scale=1 for a number already in percent.

    Below 0.001% it says so ('< 0.001%') rather than print a row of zeros ('0.000000260%').
    """
    if x is None or not math.isfinite(x):
        return "n/a"
    if x and abs(x * scale) < 1e-3:
        return f"{'> -' if x < 0 else '< '}0.001%"
    return f"{sig(x * scale, digits)}%"


def ratio(x: float | None, digits: int = 3) -> str:
    """A speed ratio: ratio(7.891) -> '7.89x'. One spelling for a quantity: a ratio is never shown as a percent."""
    return "n/a" if x is None or not math.isfinite(x) else f"{sig(x, digits)}x"


def power_of_two(x: float) -> str:
    """A scale factor as a reader writes it: power_of_two(2**-10) -> '2^-10'; other numbers (and 1) as '%g'."""
    e = math.log2(x) if x > 0 else 0.5
    return f"2^{e:.0f}" if e.is_integer() and e != 0 else f"{x:g}"


def plural(n: float, word: str, plural_form: str | None = None) -> str:
    """'1 kernel', '3 kernels' (an irregular plural via `plural_form`)."""
    many = plural_form or (word + "es" if word.endswith(("s", "x", "ch", "sh")) else word + "s")
    shown = f"{n:,}" if isinstance(n, int) else sig(n)
    return f"{shown} {word if n == 1 else many}"
