"""Result files: one JSON per notebook run, written atomically, in one schema; and the reference runs.

Schema (version 1):
    {"schema": 1, "notebook": "01_measuring", "device": {...DeviceInfo...}, "smoke": bool, "created": iso-time,
     "params": {...}, "wall_s": seconds the notebook ran,
     "experiments": [{"name", "before", "after", "speedup", "within_noise", "verdict", "headline", ...}],
     "claims": [{"text", "expected", "measured", "verdict", ...}], "extra": {...}}
"""
from __future__ import annotations

import datetime as _dt
import html
import json
import math
import os
import time
from pathlib import Path
from typing import Any

from ..measuring.device import DeviceInfo, get_device, host_difference
from .experiment import Claim, Comparison
from .tally import match_claims
from ..measuring.host import recorded_host, speed_difference
from ..measuring.files import _clean, data_dir, results_dir, write_json_atomic  # noqa: F401 (gl.results.data_dir)

SCHEMA_VERSION = 1
REFERENCE_SLUG = "nvidia-h200"  # the GPU the committed reference numbers were measured on
REQUIRED_KEYS = ("notebook", "device", "smoke", "experiments", "claims")
AS_REFERENCE_ENV = "GPULAB_AS_REFERENCE"  # set by `gpulab run --as-reference` for the notebooks it starts


def code_commit() -> str | None:
    """The commit this code runs from: $GPULAB_COMMIT where the checkout travelled without .git, else git's HEAD
    (with "+dirty" when tracked files differ from it), else None."""
    env = os.environ.get("GPULAB_COMMIT")
    if env:
        return env
    import subprocess

    repo = Path(__file__).resolve().parents[2]
    try:
        head = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True,
                              timeout=5)
        if head.returncode != 0:
            return None
        dirty = subprocess.run(["git", "-C", str(repo), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=5).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return head.stdout.strip() + ("+dirty" if dirty else "")


class NotebookResult:
    """Collects what one notebook measured (experiments, claims, extra tables) and saves it as JSON."""

    def __init__(self, notebook: str, *, smoke: bool, device: DeviceInfo | None = None,
                 params: dict[str, Any] | None = None):
        if not notebook or not isinstance(notebook, str) or "/" in notebook:
            raise ValueError(f"notebook={notebook!r} must be a name like '01_measuring'")
        self.notebook, self.smoke = notebook, bool(smoke)
        self.device = device or get_device()
        self.params = params or {}
        self.params_given: list[str] = []  # the parameters the reader set; the rest took the notebook's sizes
        self.experiments: list[Comparison] = []
        self.claims: list[Claim] = []
        self.extra: dict[str, Any] = {}
        self.headlines: set[str] = set()  # names of the experiments the page leads with
        self._started = time.perf_counter()  # the notebook's wall time runs from here (its first cell)

    def add(self, comparison: Comparison, *, headline: bool = False) -> Comparison:
        """Record a before/after comparison; `headline=True` puts it at the top of the page; returns it for display."""
        if not isinstance(comparison, Comparison):
            raise ValueError("comparison must be a Comparison (from before_after)")
        self.experiments = [c for c in self.experiments if c.name != comparison.name] + [comparison]
        if headline:
            self.headlines.add(comparison.name)
        return comparison

    @property
    def wall_s(self) -> float:
        """Seconds since this result was made (at the top of the notebook)."""
        return time.perf_counter() - self._started

    def claim(self, claim: Claim) -> Claim:
        """Record a checked claim; returns it for display."""
        if not isinstance(claim, Claim):
            raise ValueError("claim must be a Claim")
        same = (lambda c: c.key == claim.key) if claim.key else (lambda c: c.text == claim.text)
        self.claims = [c for c in self.claims if not same(c)] + [claim]
        return claim

    def record(self, key: str, value: Any) -> Any:
        """Keep any other measured table (a sweep, a finder's result) under `extra[key]`."""
        self.extra[key] = value
        return value

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict: device, params, experiments, claims and extra tables."""
        return _clean({"schema": SCHEMA_VERSION, "notebook": self.notebook, "device": self.device.to_dict(),
                       "smoke": self.smoke, "commit": code_commit(), "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
                       "params": self.params, "params_given": self.params_given, "wall_s": round(self.wall_s, 1),
                       "experiments": [dict(c.to_dict(), headline=c.name in self.headlines) for c in self.experiments],
                       "claims": [c.to_dict() for c in self.claims], "extra": self.extra})

    def path(self, root: Path | str | None = None) -> Path:
        """Where `save` writes: <root or the results folder>/<device slug>/<notebook>.json."""
        root = Path(root) if root else results_dir()
        return root / self.device.slug / f"{self.notebook}.json"

    def save(self, root: Path | str | None = None) -> Path:
        """Write <root or $GPULAB_RESULTS or data/results>/<gpu-slug>/<notebook>.json atomically; return its path."""
        return write_json_atomic(self.path(root), self.to_dict())

    def _repr_html_(self) -> str:
        exp = "".join(f"<tr><td>{c.name}</td><td>{c.verdict}</td></tr>" for c in self.experiments)
        cl = "".join(f"<tr><td>{c.text}</td><td>{c.expected}</td><td>{c._measured_str()}</td><td>{c.verdict}</td></tr>"
                     for c in self.claims)
        return (f"<b>{self.notebook}</b> on {self.device.name}{' (smoke)' if self.smoke else ''}"
                f"<table><tr><th>experiment</th><th>result</th></tr>{exp}</table>"
                f"<table><tr><th>claim</th><th>expected</th><th>measured</th><th>verdict</th></tr>{cl}</table>")


class ResultError(ValueError):
    """A result file that is missing, not JSON, or not in the schema."""


def _is_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def validate(data: Any, source: str = "result") -> dict[str, Any]:
    """Check a loaded result against the schema; raise ResultError saying what is wrong and where."""
    if not isinstance(data, dict):
        raise ResultError(f"{source}: expected a JSON object, got {type(data).__name__}")
    schema = data.get("schema", 1)  # files from before the field existed are version 1
    if isinstance(schema, bool) or not isinstance(schema, int) or schema < 1:
        raise ResultError(f"{source}: 'schema' must be a whole number >= 1, got {schema!r}")
    if schema > SCHEMA_VERSION:  # its fields may mean something else here: never count its claims as ours
        raise ResultError(f"{source}: written by a newer gpulab (schema {schema}; this one reads {SCHEMA_VERSION}); "
                          "update gpulab to read it")
    missing = [k for k in REQUIRED_KEYS if k not in data]
    if missing:
        raise ResultError(f"{source}: missing keys {missing}")
    if not isinstance(data["notebook"], str) or not data["notebook"]:
        raise ResultError(f"{source}: 'notebook' must be a name like '01_measuring'")
    if not isinstance(data["device"], dict):
        raise ResultError(f"{source}: 'device' must be an object")
    if not isinstance(data["experiments"], list) or not isinstance(data["claims"], list):
        raise ResultError(f"{source}: 'experiments' and 'claims' must be lists")
    for i, c in enumerate(data["claims"]):
        if not isinstance(c, dict) or not {"text", "verdict"} <= c.keys():
            raise ResultError(f"{source}: claim {i} needs 'text' and 'verdict'")
        if c.get("measured") is not None and not _is_number(c["measured"]):
            raise ResultError(f"{source}: claim {i} 'measured' must be a number or null, got {c['measured']!r}")
    for i, e in enumerate(data["experiments"]):
        if not isinstance(e, dict) or not {"name", "before", "after", "speedup"} <= e.keys():
            raise ResultError(f"{source}: experiment {i} needs 'name', 'before', 'after', 'speedup'")
        if not _is_number(e["speedup"]):
            raise ResultError(f"{source}: experiment {e['name']!r} 'speedup' must be a number, got {e['speedup']!r}")
        ratios = [e.get("ratio")] + list(e.get("ratio_interval") or [])
        if any(r is not None and not _is_number(r) for r in ratios):
            raise ResultError(f"{source}: experiment {e['name']!r} 'ratio' and its interval must be finite numbers")
        for side in ("before", "after"):
            if not isinstance(e[side], dict) or not isinstance(e[side].get("summary"), dict):
                raise ResultError(f"{source}: experiment {e['name']!r} '{side}' needs a 'summary' object")
    return data


def load_result(path: Path | str) -> dict[str, Any]:
    """Load and validate one result JSON file (raises ResultError naming the file and the reason)."""
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ResultError(f"{path}: no such file") from None
    except UnicodeDecodeError as e:
        raise ResultError(f"{path}: not a text file ({e.reason} at byte {e.start})") from None
    except json.JSONDecodeError as e:
        raise ResultError(f"{path}: not valid JSON ({e})") from None
    except OSError as e:
        raise ResultError(f"{path}: cannot be read ({e.strerror or e})") from None
    return validate(data, str(path))


def reference_dir(slug: str | None = None) -> Path:
    """Folder of the committed reference run (default: the reference GPU's)."""
    return data_dir() / "reference" / (slug or REFERENCE_SLUG)


def making_reference() -> bool:
    """True while this run is the reference GPU's new reference run (`gpulab run --as-reference`).

    Such a run is shown beside nothing: its pages become the reference, so they must not show the older
    reference run of the same GPU (perhaps of other code) as if it were another GPU's numbers.
    """
    return os.environ.get(AS_REFERENCE_ENV) == "1"


def load_reference(notebook: str, slug: str | None = None) -> dict[str, Any] | None:
    """The reference GPU's result for `notebook`, or None when there is none (yet) or this run is making it."""
    if making_reference() and (slug or REFERENCE_SLUG) == REFERENCE_SLUG:
        return None
    path = reference_dir(slug) / f"{notebook}.json"
    if not path.exists():
        return None
    return load_result(path)


DEFAULT_MODE = " (mode=default)"  # names and labels carry torch.compile's mode; an older run's without it ran this one


def named(entries: dict[str, Any], name: str) -> Any:
    """The entry of a reference run named `name` (an experiment, a bar's label), or None: by the same name, else
    by the name before the compile mode joined it ("GPT training step: eager vs torch.compile" is the older name of
    "... (mode=default)", and the other way round), so a renamed comparison still finds its reference."""
    if name in entries:
        return entries[name]
    return entries.get(name.removesuffix(DEFAULT_MODE) if name.endswith(DEFAULT_MODE) else name + DEFAULT_MODE)


def comparisons(result: dict[str, Any]) -> list[Comparison]:
    """The experiments of a loaded result as Comparison objects (for plots)."""
    return [Comparison.from_dict(e) for e in result.get("experiments", [])]


def claims(result: dict[str, Any]) -> list[Claim]:
    """The claims of a loaded result as Claim objects."""
    return [Claim.from_dict(c) for c in result.get("claims", [])]


class ReferenceView:
    """This run beside the reference GPU's run of the same notebook: speedups and claim verdicts."""

    def __init__(self, mine: NotebookResult | dict[str, Any], reference: dict[str, Any] | None):
        self.mine = mine.to_dict() if isinstance(mine, NotebookResult) else mine
        self.reference = reference

    def rows(self) -> list[tuple[str, str, str]]:
        ref = self.reference or {"experiments": [], "claims": []}
        r_exp = {e["name"]: e for e in ref["experiments"]}
        rows = []
        theirs = {e["name"]: named(r_exp, e["name"]) for e in self.mine["experiments"]}  # an older name too
        shown = {id(r) for r in theirs.values() if r is not None}
        for e in self.mine["experiments"]:
            r = theirs[e["name"]]
            rows.append((e["name"], e["verdict"], r["verdict"] if r else "—"))
        rows += [(n, "—", r["verdict"]) for n, r in r_exp.items() if id(r) not in shown]

        def fmt(c):
            if not c:
                return "—"
            m = c.get("measured")
            if m is None:
                return f"{c['verdict']}"
            try:  # the claim's own spelling: "72.5%", "0.867x", "1 kernel" (not "72.5 %", "1 kernels")
                return f"{c['verdict']} ({Claim.from_dict(c)._fmt(m)})"
            except (TypeError, ValueError, KeyError):
                return f"{c['verdict']} ({m:.3g} {c.get('unit', '')})"

        # claims match on their key ("07.bf16_speed"), on the text only for an older file without keys
        pairs = match_claims(ref["claims"], self.mine["claims"])
        theirs = {id(m): r for _, r, m in pairs}
        matched = {id(r) for _, r, _ in pairs}
        for c in self.mine["claims"]:
            rows.append((f"claim: {c['text']}", fmt(c), fmt(theirs.get(id(c)))))
        for r in ref["claims"]:
            if id(r) not in matched:
                rows.append((f"claim: {r['text']}", "—", fmt(r)))
        return rows

    def _repr_html_(self) -> str:
        dev = self.mine["device"]["name"]
        if not self.reference:
            if making_reference():
                return (f"<p>This run is the reference run of {self.mine['notebook']}: on other GPUs, its numbers "
                        "are the reference column.</p>")
            return f"<p>No reference run is committed for {self.mine['notebook']} yet.</p>"
        rdev = self.reference["device"]["name"]
        body = "".join(f"<tr><td style='text-align:left'>{a}</td><td>{b}</td><td>{c}</td></tr>"
                       for a, b, c in self.rows())
        speed = speed_difference(recorded_host(self.mine), recorded_host(self.reference))
        hosts = " ".join(filter(None, [host_difference(self.mine["device"], self.reference["device"]),
                                       speed and speed[0].upper() + speed[1:] + "."]))
        pairs = match_claims(self.reference["claims"], self.mine["claims"])
        same = sum(r["verdict"] == m["verdict"] for _, r, m in pairs)
        # Folded: a record to look up, one line on the page (the verdicts above tell this run's story).
        return ((f"<p>{hosts}</p>" if hosts else "")
                + f"<details class='gpulab-reference'><summary><b>Beside the reference GPU</b> ({html.escape(rdev)}): "
                f"{same} of {len(pairs)} claims in both runs have the same verdict (the table: click)</summary>"
                f"<table><tr><th></th><th>this run: {dev}{' (smoke)' if self.mine['smoke'] else ''}</th>"
                f"<th>reference: {rdev}</th></tr>{body}</table></details>")

    def __repr__(self) -> str:
        return "\n".join(f"{a[:60]:<60} {b:<28} {c}" for a, b, c in self.rows())


def reference_view(result: NotebookResult, slug: str | None = None) -> ReferenceView:
    """This run's results beside the committed reference run of the same notebook."""
    return ReferenceView(result, load_reference(result.notebook, slug))
