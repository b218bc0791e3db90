"""Claims of the guide and their verdicts: a measured value with its interval, judged against a claimed band.

A verdict stands on the interval, not the median:
- confirmed: the whole interval lies inside the claimed band;
- refuted: the whole interval lies outside it ("higher than claimed" or "lower than claimed");
- inconclusive: the interval straddles a band edge;
- not comparable: the claim's number belongs to another system; our proxy is shown beside it;
- not tested: this run could not measure it (the reason is kept), e.g. a timing claim in a smoke run.

Each claim is the guide's or the course's own target (`origin`, from its source): tables count them apart.
"""
from __future__ import annotations

import html
import re
from dataclasses import dataclass
from typing import Any

from ..measuring.estimates import as_number, estimate_of, with_repeats
from ..measuring.text import sig
from ..measuring.units import as_claim_unit, normalise_unit

VERDICTS = ("confirmed", "refuted", "inconclusive", "not comparable", "not tested")
EVIDENCE = ("measured", "arithmetic", "datasheet", "definition")
ORIGINS = ("guide", "course")
SMOKE_NOTE = "smoke run: sizes too small for a speed measurement"
# Units of a measured claim that a timing stands on (a speed ratio, a rate, a time, an MFU or utilization share).
TIMED_UNITS = ("x", "% gain", "%", "points", "ms", "s", "µs", "us", "TFLOP/s")


def origin_of(source: str) -> str:
    """"guide" when a claim's source is the guide or one of its companion notes ("guide §7.3", "002 review",
    "000 summary") and does not name the course as the band's author; else "course": the course's own targets and
    checks ("course target", "the 1% bar is this course's", "self-check floor") and a notebook's own claims."""
    src = (source or "").lower()
    from_guide = re.search(r"\bguide\b|\b00\d\b", src) is not None
    return "guide" if from_guide and "course" not in src else "course"


def judge(interval: tuple[float, float], low: float | None, high: float | None) -> tuple[str, str | None]:
    """(verdict, side) of an interval against the band [low, high] (either end may be open)."""
    lo, hi = interval
    if (low is None or lo >= low) and (high is None or hi <= high):
        return "confirmed", None
    if high is not None and lo > high:
        return "refuted", "higher"
    if low is not None and hi < low:
        return "refuted", "lower"
    return "inconclusive", None


PERCENT_UNITS = ("%", "% gain")  # "% gain": a ratio r read as (r - 1) x 100, "10% faster" = 1.10x


def undecided_why(interval: tuple[float, float], low: float | None, high: float | None) -> str:
    """Why an interval that holds a band's edge leaves the claim undecided, and whether more rounds could help:
    an interval wider than the band itself can refute the claim but never confirm it."""
    lo, hi = interval
    if low is not None and high is not None and hi - lo > high - low:
        return (f"cannot decide here because the interval ({hi - lo:.3g} wide) is wider than the band ({high - low:.3g}"
                " wide): this measurement's spread can refute the claim, never confirm it")
    edge = low if low is not None and lo < low <= hi else high
    return (f"undecided: the interval [{lo:.4g}, {hi:.4g}] holds the band's edge {edge:g}; a narrower one (more "
            "rounds) could decide")


@dataclass
class Claim:
    """A quantitative claim of the guide, the band it predicts, what we measured and the verdict.

    `evidence` says what kind of check it is: "measured" (timed or read off the device in this run),
    "arithmetic" (a formula evaluated), "datasheet" (a lookup in the peak table), "definition" (a fact
    about a format or an API). Only "measured" verdicts count as measured confirmations or refutations.
    """

    text: str
    low: float | None = None
    high: float | None = None
    unit: str = "x"
    source: str = ""
    evidence: str = "measured"
    measured: float | None = None
    interval: tuple[float, float] | None = None
    verdict: str = "not tested"
    side: str | None = None
    note: str = ""
    measurement: str | None = None  # an id shared by claims that reuse one measurement
    key: str = ""  # a stable id ("07.bf16_speed"): runs, summaries and tests match claims on it, never on wording
    quote: str = ""  # the source's own words, verbatim; `text` may shorten them
    origin: str = ""  # "guide" or "course" ("" derives it from `source`)
    timed: bool | None = None  # None: a measured claim in a speed, time, MFU or utilization unit is timed

    def __post_init__(self):
        self.origin = self.origin or origin_of(self.source)
        self.unit = normalise_unit(self.unit, self.text)
        if self.origin not in ORIGINS:
            raise ValueError(f"origin={self.origin!r}; allowed: {', '.join(ORIGINS)}")
        for name in ("low", "high"):
            v = getattr(self, name)
            # "2" would pass float() and fail only at check(): a band is numbers, refused here by name
            if v is not None and (isinstance(v, (str, bytes)) or as_number(v) is None):
                raise ValueError(f"Claim {self.text!r}: {name}={v!r} must be a finite number or None")
        if self.low is None and self.high is None:
            raise ValueError(f"Claim {self.text!r} needs low and/or high: the range the claim predicts")
        if self.low is not None and self.high is not None and self.low > self.high:
            raise ValueError(f"Claim {self.text!r}: low={self.low} must be <= high={self.high}")
        if self.evidence not in EVIDENCE:
            raise ValueError(f"evidence={self.evidence!r}; allowed: {', '.join(EVIDENCE)}")
        if self.verdict not in VERDICTS:
            raise ValueError(f"verdict={self.verdict!r}; allowed: {', '.join(VERDICTS)}")
        if self.interval is not None:
            self.interval = (float(self.interval[0]), float(self.interval[1]))

    @property
    def is_timed(self) -> bool:
        """Whether the verdict stands on a timing (a speed, a ratio of times, MFU or utilization): a measured claim
        marked `timed`, or by default one whose unit is a rate, a time, "x", "%" or "points"."""
        if self.evidence != "measured":
            return False
        if self.timed is not None:
            return bool(self.timed)
        return self.unit in TIMED_UNITS or self.unit.endswith("/s")

    def _unit(self, v: float | None) -> str:
        """The unit after a number, singular after exactly 1: "1 kernel", "1 sync per step", "3 kernels"."""
        word, _, rest = self.unit.partition(" ")
        if v == 1 and len(word) > 3 and word.isalpha() and word.endswith("s"):
            word = word[:-1]
        return f"{word} {rest}".rstrip()

    @property
    def expected(self) -> str:
        """The band as text, e.g. ">= 1.3x" or "40-60%"."""
        one = self.high if self.low is None else self.low if self.high is None or self.low == self.high else None
        u = "" if self.unit in ("x",) + PERCENT_UNITS or not self.unit else f" {self._unit(one)}"  # "2 kernels"
        sfx = "x" if self.unit == "x" else ("%" if self.unit in PERCENT_UNITS else "")
        if self.low is not None and self.high is not None:
            if self.low == self.high:
                return f"{self.low:g}{sfx}{u}"
            return f"{self.low:g}–{self.high:g}{sfx}{u}"
        return f">= {self.low:g}{sfx}{u}" if self.low is not None else f"<= {self.high:g}{sfx}{u}"

    def check(self, measured: Any, note: str = "", *, interval: tuple[float, float] | None = None,
              measurement: str | None = None, repeats: Any = None) -> Claim:
        """Judge the claim on `measured` and its interval; returns self for display.

        `measured` may be a number (with `interval=`, or exact for counts and arithmetic), an `Estimate`, a Speedup or
        Measurement (interval from their spread), or a Comparison, judged on its headline ratio (items/s where the two
        sides do different work per call, else time). `repeats` (the same quantity measured again) widen the interval
        to their spread. NaN, inf, None or a non-scalar gives "not tested", never a verdict."""
        measured, interval, converted = as_claim_unit(measured, interval, self.unit)
        note = "; ".join(filter(None, (note, converted)))
        est = estimate_of(measured if interval is None else (measured, interval))
        if est is None:
            return self.untestable(note or "no finite measurement")
        if not est.lo <= est.value <= est.hi:
            raise ValueError(f"interval {est.interval} does not contain the measured value {est.value}")
        est = with_repeats(est, repeats)
        self.measured, self.interval = est.value, est.interval
        self.verdict, self.side = judge(est.interval, self.low, self.high)
        self.note, self.measurement = note, measurement
        if self.verdict == "inconclusive":
            self.note = "; ".join(x for x in (note, undecided_why(est.interval, self.low, self.high)) if x)
        return self

    def not_comparable(self, proxy: Any = None, reason: str = "", *, measurement: str | None = None) -> Claim:
        """The claim's number belongs to another system: show our proxy beside it, judge nothing."""
        if not reason:
            raise ValueError("not_comparable needs a reason: which system the claim's number belongs to")
        est = estimate_of(proxy)
        self.measured = est.value if est else None
        self.interval = est.interval if est else None
        self.verdict, self.side, self.note, self.measurement = "not comparable", None, reason, measurement
        return self

    def untestable(self, reason: str) -> Claim:
        """Mark the claim as not testable here, saying why."""
        if not reason:
            raise ValueError("untestable needs a reason")
        self.measured, self.interval, self.verdict, self.side, self.note = None, None, "not tested", None, reason
        return self

    @property
    def label(self) -> str:
        """The verdict as a reader should see it ("refuted: higher than claimed")."""
        if self.verdict == "refuted" and self.side:
            return f"refuted: {self.side} than claimed"
        return self.verdict

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (key, quote, band, measurement, verdict, note)."""
        return {"text": self.text, "expected": self.expected, "low": self.low, "high": self.high,
                "unit": self.unit, "measured": self.measured,
                "interval": list(self.interval) if self.interval else None, "verdict": self.verdict,
                "side": self.side, "evidence": self.evidence, "source": self.source, "note": self.note,
                "measurement": self.measurement, "key": self.key, "quote": self.quote, "origin": self.origin,
                "timed": self.is_timed}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Claim:
        """A Claim from `to_dict`'s dict."""
        kw = {k: v for k, v in d.items() if k in cls.__dataclass_fields__}
        if kw.get("interval") is not None:
            kw["interval"] = tuple(kw["interval"])
        if kw.get("verdict") not in VERDICTS:  # an older file: keep it readable
            kw.pop("verdict", None)
        if kw.get("origin") not in ORIGINS:
            kw.pop("origin", None)
        return cls(**kw)

    def _num(self, v: float) -> str:
        """A ratio or a percentage at three significant figures (3.00x, 46.0%); a count or another unit as %.3g
        (8 kernels, 3 points)."""
        return sig(v) if self.unit in ("x",) + PERCENT_UNITS else f"{v:.3g}"

    def _fmt(self, v: float) -> str:
        if self.unit == "% gain":  # the speedup beside it, as every comparison line shows it: "+29.7% (1.30x)"
            return f"{'+' if v > 0 else ''}{self._num(v)}% ({sig(1 + v / 100)}x)"
        return self._num(v) + ("x" if self.unit == "x" else "%" if self.unit == "%" else
                               f" {self._unit(v)}" if self.unit else "")

    def _measured_str(self) -> str:
        if self.measured is None:
            return "none measured in this run" if self.verdict == "not comparable" else "—"
        s = self._fmt(self.measured)
        if self.interval and self.interval[0] != self.interval[1]:
            s += f" [{self._num(self.interval[0])}, {self._num(self.interval[1])}]"
        return s

    def __repr__(self) -> str:
        return (f"Claim({self.text!r}: expected {self.expected}, measured {self._measured_str()} -> {self.label}"
                + f" ({self.evidence})" + (f"; {self.note}" if self.note else "") + ")")

    def _repr_html_(self) -> str:
        """One verdict line (the claim, its band, what we measured, the verdict); source, evidence and note folded."""
        e = html.escape
        line = (f"<i>“{e(self.text)}”</i> — expected {e(self.expected)}, measured {e(self._measured_str())}: "
                f"<b style='color:{_COLORS.get(self.verdict, '#666')}'>{e(self.label.upper())}</b>")
        more = (f"{e(self.source) + '; ' if self.source else ''}evidence: {e(self.evidence)}"
                + (f"; {e(self.note)}" if self.note else ""))
        return (f"<details class='gpulab-verdict'><summary>{line}</summary><small>{more}</small></details>")


_COLORS = {"confirmed": "#1a7f37", "refuted": "#b42318", "inconclusive": "#b35900", "not comparable": "#1f4e99"}
