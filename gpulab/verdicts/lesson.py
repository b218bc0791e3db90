"""One call at the top of a lesson notebook: the device, its sizes, the result object, the reference, and the
section's claims declared as data.

    lesson = gl.lesson("07_mixed_precision", globals(), claims=M.CLAIMS)   # a course notebook: sizes from its schema
    lesson = gl.lesson("my_notebook", globals(), full=dict(BATCH=64), smoke=dict(BATCH=4),   # a notebook of yours
                       claims=[dict(key="mfu", text="40-60% MFU", quote="40-60% MFU: good transformer training",
                                    low=40, high=60, unit="%", source="guide §1", needs=("cuda",))])
    dev, res = lesson.device, lesson.result
    ...
    lesson.check("mfu", comparison)          # "not tested: needs a CUDA GPU" comes from `needs`, in one place
    lesson.save()"""
from __future__ import annotations

import os

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

from .claims import SMOKE_NOTE, Claim
from ..measuring.device import DeviceInfo, dtype_support, get_device
from ..measuring.files import make_writable, results_dir
from ..measuring.host import host_speed, launch_range_us, recorded_host
from .results import NotebookResult, load_reference, making_reference

# What a claim may need, and how to tell whether this run has it: need -> (test(lesson) -> reason or None).
NEEDS: dict[str, Callable[[Lesson], str | None]] = {}


def need(name: str) -> Callable[[Callable[[Lesson], str | None]], Callable[[Lesson], str | None]]:
    """Register a requirement a claim can name in `needs` (a function giving the reason it is missing, or None)."""
    def register(fn: Callable[[Lesson], str | None]) -> Callable[[Lesson], str | None]:
        NEEDS[name] = fn
        return fn
    return register


@need("cuda")
def _cuda(lesson: Lesson) -> str | None:
    return None if lesson.device.is_cuda else "needs a CUDA GPU"


@need("full")
def _full(lesson: Lesson) -> str | None:
    return None if not lesson.small else "needs the full sizes (this run used smoke sizes)"


@need("nvml")
def _nvml(lesson: Lesson) -> str | None:
    return lesson._availability("nvml_util", "needs NVML (a CUDA GPU with nvidia-ml-py)")


@need("gpm")
def _gpm(lesson: Lesson) -> str | None:
    return lesson._availability("gpm_tensor_active", "needs GPM counters (Hopper or newer, recent driver)")


def _dtype_need(dtype: str, what: str) -> Callable[[Lesson], str | None]:
    def missing(lesson: Lesson) -> str | None:
        why = dtype_support(lesson.device, dtype)
        return f"needs {what}: {why}" if why else None
    return missing


need("fp8")(_dtype_need("fp8", "FP8 tensor cores"))
need("bf16")(_dtype_need("bf16", "BF16"))


@need("compiler")
def _compiler(lesson: Lesson) -> str | None:
    from ..measuring.compiler import compiler_available
    ok, why = compiler_available(lesson.device.torch_device)
    return None if ok else f"needs a compiler for torch.compile: {why}"


@need("multi_gpu")
def _multi_gpu(lesson: Lesson) -> str | None:
    import torch
    n = torch.cuda.device_count() if lesson.device.is_cuda else 0
    return None if n >= 2 else f"needs two or more CUDA GPUs (this machine has {n})"


@dataclass(frozen=True)
class ClaimSpec:
    """A claim of the guide as data: its text, the band it predicts, where it comes from and what it needs."""

    key: str
    text: str
    low: float | None = None
    high: float | None = None
    unit: str = "x"
    source: str = ""
    evidence: str = "measured"
    needs: tuple[str, ...] = ()
    quote: str = ""  # the guide's words verbatim; `text` may be a shorter label of them
    timed: bool | None = None  # whether it stands on a timing (None: from the unit, `Claim.is_timed`)

    @property
    def origin(self) -> str:
        """"guide" when its source is the guide or a companion note, else "course" (`claims.origin_of`)."""
        return self.new().origin

    def __post_init__(self):
        if not self.key or not isinstance(self.key, str):
            raise ValueError(f"claim key={self.key!r} must be a non-empty string")
        unknown = [n for n in self.needs if n not in NEEDS]
        if unknown:
            raise ValueError(f"claim {self.key!r}: needs={unknown}; allowed: {', '.join(sorted(NEEDS))}")
        self.new()  # the band and the evidence kind are checked where a Claim checks them

    def key_in(self, notebook: str = "") -> str:
        """The claim's stable key in results: "NN.key" after its notebook's number (or its name), else the key."""
        prefix = notebook.split("_", 1)[0] if notebook else ""
        return f"{prefix}.{self.key}" if prefix else self.key

    def new(self, notebook: str = "") -> Claim:
        """A fresh Claim of this spec, keyed for `notebook` (see `key_in`)."""
        return Claim(self.text, low=self.low, high=self.high, unit=self.unit, source=self.source,
                     evidence=self.evidence, key=self.key_in(notebook), quote=self.quote or self.text,
                     timed=self.timed)


def _as_spec(c: ClaimSpec | dict[str, Any]) -> ClaimSpec:
    if isinstance(c, ClaimSpec):
        return c
    if not isinstance(c, dict):
        raise ValueError(f"a claim is a dict or ClaimSpec, got {type(c).__name__}")
    c = dict(c)
    c["needs"] = tuple([c["needs"]] if isinstance(c.get("needs"), str) else c.get("needs", ()))
    return ClaimSpec(**c)


class SectionClock:
    """Seconds spent per section of a notebook, from one clock started at the top: what to trim if it runs long."""

    def __init__(self, clock: Callable[[], float] = time.perf_counter) -> None:
        self.clock = clock
        self.start = self.last = clock()
        self.seconds: dict[str, float] = {}

    def mark(self) -> None:
        """Start timing a section here (what ran since the last lap is left out)."""
        self.last = self.clock()

    def lap(self, name: str) -> None:
        """Close section `name`: its seconds are the time since the previous lap or mark (or the start)."""
        now = self.clock()
        self.seconds[name], self.last = now - self.last, now

    def elapsed(self) -> float:
        """Seconds since the clock started."""
        return self.clock() - self.start

    def to_dict(self) -> dict[str, float]:
        """Every section's seconds, and the total so far."""
        return dict(self.seconds, total=self.elapsed())


@dataclass
class Lesson:
    """What a lesson notebook needs from its first cell on: device, sizes, result, reference and claims."""

    name: str
    device: DeviceInfo
    small: bool
    sizes: dict[str, Any]
    result: NotebookResult
    reference: dict[str, Any] | None
    claims: dict[str, ClaimSpec] = field(default_factory=dict)
    _monitor_availability: dict[str, str] | None = field(default=None, repr=False)

    @property
    def gpu(self) -> bool:
        """True on a CUDA GPU."""
        return self.device.is_cuda

    def _availability(self, metric: str, reason: str) -> str | None:
        if not self.device.is_cuda:
            return reason
        if self._monitor_availability is None:
            from ..measuring.monitor import availability
            self._monitor_availability = availability(self.device)
        state = self._monitor_availability.get(metric, "not reported")
        return None if state == "ok" else f"{reason}: {state}"

    def missing(self, *needs: str) -> str | None:
        """Why this run cannot test something that needs `needs` ("needs a CUDA GPU; ..."), or None."""
        reasons = []
        for n in needs:
            if n not in NEEDS:
                raise ValueError(f"need={n!r}; allowed: {', '.join(sorted(NEEDS))}")
            why = NEEDS[n](self)
            if why:
                reasons.append(why)
        return "; ".join(reasons) or None

    def spec(self, key: str) -> ClaimSpec:
        """The declared ClaimSpec of `key` (KeyError naming the declared keys if there is none)."""
        if key not in self.claims:
            raise KeyError(f"no claim {key!r} in {self.name}; declared: {', '.join(self.claims) or 'none'}")
        return self.claims[key]

    def testable(self, key: str) -> bool:
        """Whether this run has everything claim `key` needs."""
        return self.missing(*self.spec(key).needs) is None

    def check(self, key: str, measured: Any, note: str = "", *, interval: tuple[float, float] | None = None,
              measurement: str | None = None, repeats: Any = None) -> Claim:
        """Judge claim `key` on a measurement and record it; `Claim.check` says what `measured` may be (a
        Comparison is judged on its headline ratio) and how `repeats` widen the interval to their spread.

        Not tested instead: when this run lacks what the claim needs (`needs`), or when a smoke run meets a timed claim
        (`Claim.is_timed`), whose verdict such sizes cannot carry."""
        spec = self.spec(key)
        why = self.missing(*spec.needs)
        claim = spec.new(self.name)
        if why:
            claim.untestable(why)
        elif self.small and claim.is_timed:
            claim.untestable(SMOKE_NOTE)
            claim.measurement = measurement  # what a full-size run judges it on
        else:
            claim.check(measured, note, interval=interval, measurement=measurement, repeats=repeats)
        return self.result.claim(claim)

    def not_comparable(self, key: str, proxy: Any = None, reason: str = "", *,
                       measurement: str | None = None) -> Claim:
        """Record claim `key` as belonging to another system, our proxy shown beside it."""
        return self.result.claim(self.spec(key).new(self.name).not_comparable(proxy, reason, measurement=measurement))

    def untested(self, key: str, reason: str) -> Claim:
        """Record claim `key` as not tested here, with the reason."""
        return self.result.claim(self.spec(key).new(self.name).untestable(reason))

    def pending(self) -> list[str]:
        """Declared claims not recorded yet (each should end checked, not comparable or not tested)."""
        done = {c.key for c in self.result.claims}
        return [k for k, spec in self.claims.items() if spec.key_in(self.name) not in done]

    def save(self) -> Any:
        """Mark declared claims that were never reached as not tested, then write the result JSON atomically.

        It times the host's kernel launch once more first: with the time taken at the start, the result holds
        how fast the host ran during the lesson (it can change while a shared machine's other tenants work)."""
        for key in self.pending():
            why = self.missing(*self.spec(key).needs) or "not reached in this run"
            self.untested(key, why)
        host = self.result.extra.get("host")
        if isinstance(host, dict) and (now := host_speed(self.device)):
            host["launch_us_end"] = now["launch_us"]
        return self.result.save()

    def __repr__(self) -> str:  # the dataclass's would print the whole reference result
        return (f"Lesson({self.name!r}, {'smoke' if self.small else 'full'} sizes, {self.device.name}, "
                f"{len(self.claims)} claims, reference: {'yes' if self.reference else 'none'})")

    def _repr_html_(self) -> str:
        sizes = ", ".join(f"{k}={v}" for k, v in self.sizes.items())
        banner = "" if self.gpu else (
            "<p><b>No CUDA GPU here.</b> Everything below runs on the CPU at smoke sizes; GPU-only readings show "
            "<i>n/a</i>, the claims about them are marked <i>not tested</i>, and the reference GPU's numbers are "
            "shown beside ours where they exist.</p>")
        ref = (f"reference: {self.reference['device']['name']}" if self.reference and self.reference.get("device")
               else "this run is the reference run: other GPUs' pages show its numbers beside theirs"
               if making_reference() else "no reference result for this notebook")
        import html as _html

        e = _html.escape
        # Two short lines; the sizes and the device's table folded, once per page.
        device = (f"<details><summary>device: {e(str(self.device.name))}; {len(self.sizes)} sizes (the details: "
                  f"click)</summary><small>{e(sizes)}</small>{self.device._repr_html_()}</details>")
        return (f"<p><b>{self.name}</b> at {'smoke' if self.small else 'full'} sizes; {e(ref)}"
                f"{self._host_line()}</p>{device}{banner}")

    def _host_line(self) -> str:
        """'host: 6.4 µs per kernel launch (the reference's: 6.2 µs)', or nothing where none was timed."""
        host = self.result.extra.get("host")
        if not isinstance(host, dict) or host.get("launch_us") is None:
            return ""
        ref = launch_range_us(recorded_host(self.reference))
        what = "kernel launch" if self.device.is_cuda else "eager op"
        return (f"<br>host: {host['launch_us']:.2g} µs per {what}"
                + (f" (the reference's: {ref[0]:.2g} µs)" if ref else "")
                + "; loops of small kernels, sync points and data loading run at the host's speed")


def lesson(name: str, namespace: dict[str, Any], *, full: dict[str, Any] | None = None,
           smoke: dict[str, Any] | None = None, claims: Iterable[ClaimSpec | dict[str, Any]] = (),
           device: DeviceInfo | None = None, show: bool = True) -> Lesson:
    """Start lesson `name`: choose sizes, make its result object, load the reference, declare its claims.

    `namespace` is the notebook's `globals()`. Sizes follow `Param`'s rule, from the notebook's schema in
    `gpulab.verdicts.params` or, for a notebook of your own, from `full=` / `smoke=`; they are written back into the
    namespace, then every parameter is checked. `save()` writes the result to $GPULAB_RESULTS/<device>/<name>.json,
    or without that variable to data/results/<device>/."""
    from .params import SCHEMAS, check_params

    if not isinstance(namespace, dict):
        raise ValueError("namespace must be the notebook's globals()")
    full, smoke = dict(full or {}), dict(smoke or {})
    extra = sorted(set(smoke) - set(full))
    if extra:
        raise ValueError(f"smoke sizes {extra} have no full size; give each in full= too")
    if os.environ.get("GPULAB_RESULTS"):  # a file, a read-only folder or the reference runs stop here, before any work
        make_writable(results_dir(), "GPULAB_RESULTS")
    device = device or get_device()
    small = bool(namespace.get("SMOKE", False)) or not device.is_cuda
    schema = SCHEMAS.get(name, {})
    sizes, given = {}, []
    for key in list(full) + [k for k, p in schema.items() if p.has_default and k not in full]:
        value = namespace.get(key)
        if value is not None:
            given.append(key)
        elif key in full:
            value = smoke.get(key, full[key]) if small else full[key]
        else:
            value = schema[key].size_for(small)
        namespace[key] = sizes[key] = value
    if schema:  # every parameter, a reader's and the defaults chosen here, before any work starts
        check_params(namespace, name)
        if small and not device.is_cuda:
            import torch

            # Tiny ops on several CPU threads only add synchronization, and noise on a busy machine.
            torch.set_num_threads(1)
    specs = [_as_spec(c) for c in claims]
    keys = [s.key for s in specs]
    dupes = sorted({k for k in keys if keys.count(k) > 1})
    if dupes:
        raise ValueError(f"claim keys {dupes} are declared twice")
    result = NotebookResult(name, smoke=small, device=device, params=dict(sizes))
    result.params_given = sorted(given)
    host = host_speed(device)  # launch-bound numbers follow the host's speed: a comparison can say so
    if host:
        result.record("host", host)
    out = Lesson(name, device, small, sizes, result, load_reference(name), {s.key: s for s in specs})
    if show:
        try:
            from IPython.display import display
            display(out)
        except ImportError:
            print(f"{name}: {device.name}, {'smoke' if small else 'full'} sizes")
    return out
