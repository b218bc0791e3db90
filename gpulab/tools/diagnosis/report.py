"""A diagnosis and its findings: ranking, text, an HTML table and a JSON-ready dict."""
from __future__ import annotations

import html
from dataclasses import asdict, dataclass, field
from typing import Any

KINDS = ("launch_bound", "sync", "data_wait", "small_batch", "fp32_matmul", "attention", "layout", "optimizer",
         "elementwise", "healthy")


@dataclass
class Finding:
    """One thing that slows the step: its share of step time, the numbers it rests on, the fix and its lesson."""

    kind: str
    share: float  # of the step's time it explains: what its fix can win by removing it (Amdahl; layout's fix more)
    evidence: dict[str, Any]
    fix: str  # the change as code the user would type
    notebook: str  # the lessons that explain it, e.g. "03_fusion, 09_profiling"
    title: str = ""
    gain: dict[str, Any] | None = None  # measured speedup: value, lo, hi, verdict, basis (from gl.before_after)
    why: str = ""  # why no gain was measured, or why the fix made the step slower

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"kind={self.kind!r}; allowed: {', '.join(KINDS)}")

    @property
    def measured(self) -> bool:
        """Whether a fix was tried and timed."""
        return self.gain is not None

    @property
    def faster(self) -> bool:
        """Whether the measured fix is faster with its whole interval above 1."""
        return self.gain is not None and self.gain["lo"] > 1.0

    @property
    def slower(self) -> bool:
        """Whether the measured fix made the step slower (its whole interval below 1)."""
        return self.gain is not None and self.gain["hi"] < 1.0

    def gain_text(self) -> str:
        """"1.52x [1.48, 1.57]", "0.81x [0.79, 0.83] (slower)", or "not measured"."""
        if self.gain is None:
            return "not measured"
        g = self.gain
        tail = " (slower)" if self.slower else " (within noise)" if not self.faster else ""
        return f"{g['value']:.2f}x [{g['lo']:.2f}, {g['hi']:.2f}]{tail}"

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return asdict(self)


def rank(findings: list[Finding]) -> list[Finding]:
    """Fixes measured faster first, by their gain; then the others by share (within noise, slower, untried)."""
    return sorted(findings, key=lambda f: (0, -f.gain["value"], 0.0) if f.faster else (1, 0.0, -f.share))


@dataclass
class Diagnosis:
    """What slows a training step, most step time first; `healthy` when no rule passed its threshold."""

    findings: list[Finding]
    evidence: dict[str, Any] = field(default_factory=dict)
    needs_gpu: list[str] = field(default_factory=list)  # kinds a CPU run cannot judge
    notes: list[str] = field(default_factory=list)
    seconds: float = 0.0
    comparisons: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)  # kind -> gl.Comparison

    @property
    def healthy(self) -> bool:
        """True when the loop has no finding above its threshold."""
        return [f.kind for f in self.findings] == ["healthy"]

    @property
    def top(self) -> Finding:
        """The first finding (the verdict `healthy` when there is none)."""
        return self.findings[0]

    def comparison(self, kind: str) -> Any:
        """The measured before/after (a gl.Comparison) of `kind`'s fix, or None where none was measured."""
        return self.comparisons.get(kind)

    def kinds(self) -> list[str]:
        """The findings' kinds, in order."""
        return [f.kind for f in self.findings]

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return {"findings": [f.to_dict() for f in self.findings], "kinds": self.kinds(), "healthy": self.healthy,
                "evidence": self.evidence, "needs_gpu": list(self.needs_gpu), "notes": list(self.notes),
                "seconds": self.seconds}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Diagnosis:
        """A Diagnosis from `to_dict`'s dict."""
        return cls(findings=[Finding(**f) for f in d["findings"]], evidence=d.get("evidence", {}),
                   needs_gpu=list(d.get("needs_gpu", [])), notes=list(d.get("notes", [])),
                   seconds=float(d.get("seconds", 0.0)))

    def _head(self) -> str:
        ev = self.evidence
        step = ev.get("step_ms")
        where = "GPU" if ev.get("gpu") else "CPU"
        return (f"{where} step {step:.3g} ms" if step else f"{where} step") + (
            f", batch {ev['batch_size']}" if ev.get("batch_size") else "") + f"; diagnosed in {self.seconds:.0f} s"

    def __str__(self) -> str:
        lines = [f"Diagnosis ({self._head()})"]
        for i, f in enumerate(self.findings, 1):
            lines.append(f"{i}. healthy: {f.title}" if f.kind == "healthy" else
                         f"{i}. {f.kind}: {f.share:.0%} of the step. {f.title}")
            if f.fix:
                lines.append(f"   fix: {f.fix}")
            lines.append(f"   gain: {f.gain_text()}" + (f" ({f.why})" if f.why else "") + f"; see {f.notebook}")
        if self.needs_gpu:
            lines.append(f"needs a GPU: {', '.join(self.needs_gpu)}")
        lines += [f"note: {n}" for n in self.notes]
        return "\n".join(lines)

    def __repr__(self) -> str:
        return str(self)

    def _repr_html_(self) -> str:
        e = html.escape
        rows = "".join(
            f"<tr><td>{i}</td><td style='text-align:left'><b>{e(f.kind)}</b><br><small>{e(f.title)}</small></td>"
            f"<td>{'' if f.kind == 'healthy' else f'{f.share:.0%}'}</td>"
            f"<td style='text-align:left'><code>{e(f.fix)}</code></td>"
            f"<td>{e(f.gain_text())}" + (f"<br><small>{e(f.why)}</small>" if f.why else "") + "</td>"
            f"<td>{e(f.notebook)}</td></tr>" for i, f in enumerate(self.findings, 1))
        extra = "".join(f"<li>{e(n)}</li>" for n in self.notes)
        if self.needs_gpu:
            extra += f"<li>needs a GPU: {e(', '.join(self.needs_gpu))}</li>"
        return (f"<b>Diagnosis</b> ({e(self._head())})<table><tr><th>#</th><th>finding</th><th>share of step</th>"
                f"<th>fix</th><th>measured gain</th><th>lesson</th></tr>{rows}</table>"
                + (f"<ul>{extra}</ul>" if extra else ""))
