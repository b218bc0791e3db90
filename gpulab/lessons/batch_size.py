"""Notebook 06 (batch size): its claims as data, the sweep read by batch size (`Sweep`), the functions that judge
each claim (`check_*`, `record_the_rest`), and its figures. Nothing here times anything."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

from ..workloads.sweeps import column, gpt_step_memory_estimate, rate_over_windows, sweet_spot, trace_estimate
from ..verdicts.claims import Claim
from ..measuring.estimates import Estimate, difference, ratio
from ..tools.feeds import knee
from ..measuring.text import pct, si

GPU = ("cuda", "full")  # a GPU at the full sizes: what every speed, memory and utilization claim stands on
THEIRS = "the guide's model and GPU"
GEMMA = "Gemma-1B on an RTX 3090"
T62 = "guide §6.2 (its table; model, GPU and sequence length not stated)"
ROW8 = "8          | 45%      | 12 GB       | 120 samples/s"

CLAIMS = [
    dict(key="util_8_64", text="GPU utilization rises with batch size, 45% at batch 8 to 92% at batch 64; measured: "
         "NVML percentage points gained from 8 to 64", quote="64         | 92%", low=35, high=60, unit="points",
         source=T62, needs=GPU),
    dict(key="sweet_spot", text="the sweet spot is batch 32; measured: last batch before a bigger one gains "
         "relatively less throughput than it adds memory (the rule that gives 32 on the guide's table)", low=24,
         quote="32         | 85%      | 28 GB       | 380 samples/s  ← Sweet spot", high=48, unit="sequences",
         source=T62, needs=GPU),
    dict(key="memory_8_64", text="memory grows with batch size, 12 GB at batch 8 to 45 GB at batch 64 (3.75x); "
         "measured: peak memory ratio 64 / 8", quote=ROW8, low=2.8, high=4.7, source=T62, needs=GPU, timed=False),
    dict(key="util_8_12", text="batch 8 -> 12: 15-20% better GPU utilization; measured: relative NVML gain",
         quote="15-20% better GPU utilization", low=15, high=20, unit="% gain", source="002 review, fix 4", needs=GPU),
    dict(key="speed_12_16", text="batch 12 -> 16: 5-10% faster; measured: throughput gain",
         quote="| **Batch size 16** | Low | 5-10% | Test for OOM, use if stable |", low=5, high=10, unit="% gain",
         source="002 review, remaining optimizations", needs=GPU),
    dict(key="gain_32_64", text="from batch 32 to 64 throughput gains ~26% (380 -> 480 samples/s); measured: "
         "throughput gain", quote="380 samples/s  ← Sweet spot", low=23, high=29, unit="% gain", source=T62, needs=GPU),
    dict(key="speed_8_64", text="throughput rises 4x from batch 8 to batch 64 (120 -> 480 samples/s)",
         quote="480 samples/s", low=3, high=5, source=T62, needs=GPU),
    dict(key="eighty", text="80% of the maximum batch is a safe choice that costs little; measured: its throughput "
         "/ the maximum's, both run in paired rounds ('little': within 5%)",
         quote="Recommended batch size (80% of max)", low=0.95, source="guide §6.1", needs=GPU),
    dict(key="grads_same", text="accumulating 32 x 4 gives the same gradient update as batch 128; measured: "
         "relative L2 difference of the gradients (float32)", quote="Same gradient update as batch size 128",
         high=1e-4, unit="relative", source="guide §6.3"),
    dict(key="batchnorm", text="con: batch norm statistics are computed on micro-batches, so BatchNorm models "
         "differ; measured: relative gradient difference of a CNN with BatchNorm",
         quote="Con: Batch norm statistics computed on micro-batches", low=1e-3, unit="relative",
         source="guide §6.3"),
    dict(key="accum_slower", text="con: 4x more forward passes make accumulation slower; measured: time of 4 x B/4 "
         "over one batch B", quote="Con: 4× more forward passes (slower)", low=1.0, source="guide §6.3", needs=GPU),
    dict(key="accum_memory", text="accumulation saves memory: batch 128 needs 48 GB, 32 x 4 needs 16 GB (3x less); "
         "measured: peak memory ratio, one batch / accumulated",
         quote="Batch size 32 × 4 accumulation: 16 GB memory (fits!)", low=2.4, high=3.6, source="guide §6.3",
         needs=GPU, timed=False),
    dict(key="convergence", text="pro: same convergence as the large batch", low=1.0, high=1.0,
         quote="Pro: Same convergence as large batch", source="guide §6.3", timed=False),
    dict(key="oom_128", text="batch 128 runs out of memory (64 fits)", low=64, high=127, unit="sequences",
         quote="128        | OOM      | -           | -", source=T62, needs=GPU),
    dict(key="batch8_figures", text="batch 8 uses 12 GB and trains 120 samples/s", low=120, high=120,
         quote=ROW8, unit="samples/s", source=T62, needs=GPU),
    dict(key="accum_gb", text="batch 128 needs 48 GB, 32 x 4 accumulated needs 16 GB", low=16, high=48, unit="GB",
         quote="Batch size 128: 48 GB memory (OOM)", source="guide §6.3", needs=GPU),
    dict(key="max_safe_12", text="batch 12 is the maximum safe batch (RTX 3090, 24 GB)", low=12, high=12,
         quote="Maximum safe for RTX 3090 24GB", unit="sequences", source="002 review, fix 4", needs=GPU),
    dict(key="memory_18_20", text="memory usage 18-20 GB of 24 GB at the chosen batch", low=18, high=20, unit="GB",
         quote="18-20GB / 24GB (80-83% utilization)", source="002 review", needs=GPU),
    dict(key="usage_92_95", text="expected GPU usage 92-95% after all the changes", low=92, high=95, unit="%",
         quote="92-95% (near maximum)", source="002 review", needs=GPU),
]


def table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A Markdown table (cells already formatted)."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(str(c) for c in r) + " |" for r in rows])


@dataclass
class Sweep:
    """The timed sweep read by batch size: its rows that ran, throughput with intervals (`rate_over_windows`), peak
    memory, best, knee (smallest batch within 10% of the best) and the guide's sweet spot."""

    rows: list[dict[str, Any]]
    runs: dict[int, Any]
    seq_len: int
    ok: list[dict[str, Any]] = field(init=False)

    def __post_init__(self) -> None:
        self.ok = [r for r in self.rows if not r["oom"]]
        self.by_b = {r["batch_size"]: r for r in self.ok}
        self.thr = {b: r["samples_per_s"] for b, r in self.by_b.items()}
        self.rates = {b: rate_over_windows(self.runs[b]) for b in self.by_b}  # tokens/s: steps' and windows' spread
        self.mem = {b: r["peak_mem_gb"] for b, r in self.by_b.items() if r["peak_mem_gb"]}
        self.best = max(self.thr, key=self.thr.get)
        self.knee = knee(self.thr, 0.90)
        self.sweet = sweet_spot(list(self.by_b), self.rates, self.mem)

    def get(self, b: int, key: str) -> Any:
        r = self.by_b.get(b)
        return None if r is None else r.get(key)

    def nvml(self, b: int) -> Estimate | None:
        """Mean of NVML's samples at batch `b`, their quartiles as the interval."""
        return trace_estimate(self.runs.get(b), "nvml_util")

    def gain(self, b1: int, b2: int) -> Estimate | None:
        """% more throughput from batch b1 to b2, with its interval."""
        r = ratio(self.rates.get(b2), self.rates.get(b1)) if b1 in self.by_b and b2 in self.by_b else None
        return None if r is None else r.map(lambda x: (x - 1) * 100)

    def scaling(self) -> dict[str, Any]:
        """The result JSON's `batch_scaling`."""
        s = self.sweet
        return dict(best=self.best, knee_90=self.knee, seq_len=self.seq_len,
                    sweet_spot=None if s is None else [s.value, s.lo, s.hi])

    def table(self) -> str:
        """The sweep as a Markdown table."""
        rows = [[r["batch_size"], "out of memory", "", "", "", "", "", ""] if r["oom"] else
                [r["batch_size"], si(r["step_ms"] / 1e3, "s"), si(r["samples_per_s"]), si(r["tokens_per_s"]),
                 pct(r["mfu"]), pct(r["nvml_util"], 1), pct(r["gpm_sm_active"], 1), si(r["peak_mem_gb"], "GB")
                 if r["peak_mem_gb"] else "n/a"] for r in self.rows]
        return table(["batch", "step", "samples/s", "tokens/s", "MFU", "GPU busy (NVML)", "SM active (GPM)",
                      "peak memory"], rows)


# A bigger batch whose step takes at most this share longer than a smaller one's is launch-bound at both sizes: the
# host's launches set the step time, so samples/s rises by the batch ratio by construction. 10%: about the spread of
# the launch floor itself from one measurement to the next (25.5 to 28.2 ms on the reference H200's flat sweep).
LAUNCH_BOUND_TOLERANCE = 0.10


def launch_bound(a: int, b: int, step_a_s: float | None, step_b_s: float | None, seq_len: int | None) -> str | None:
    """Why batch a -> b cannot be judged on a ratio: one step of b takes at most `LAUNCH_BOUND_TOLERANCE` longer than
    one of a, so the ratio is b / a by construction. None where the step times differ more, or one is unknown."""
    if not step_a_s or not step_b_s or step_b_s > (1 + LAUNCH_BOUND_TOLERANCE) * step_a_s:
        return None
    at = f" at {seq_len} tokens" if seq_len else ""
    return (f"launch-bound{at}: one step takes {si(step_a_s, 's')} at batch {a} and {si(step_b_s, 's')} at {b} "
            f"(within {LAUNCH_BOUND_TOLERANCE:.0%}), so the host's launches, not the GPU, set the step time, and "
            f"samples/s rises by the batch ratio, {b / a:.3g}x, by construction")


def _judge(lesson: Any, sw: Sweep, key: str, value: Any, batches: tuple[int, ...] = (), note: str = "",
           launch: str | None = None) -> Claim:
    """Check on a GPU run when the batch sizes the claim is about were measured and `launch` (`launch_bound`'s
    reason) is None; otherwise say why not."""
    why = lesson.missing(*lesson.spec(key).needs)
    missing = [b for b in batches if b not in sw.by_b]
    if why:
        return lesson.untested(key, why)
    if missing:
        return lesson.untested(key, f"batch {', '.join(map(str, missing))} not measured: it does not fit, or ran "
                                    "out of memory in the sweep")
    if value is None:
        return lesson.untested(key, "not measured on this GPU (NVML or GPM unavailable)")
    if launch:
        read = f"; measured {value.value:+.3g}% [{value.lo:+.3g}, {value.hi:+.3g}]" if isinstance(value, Estimate) else ""
        return lesson.untested(key, f"{launch}{read}; {note}")
    return lesson.check(key, value, note)


def _steps_s(sw: Sweep, a: int, b: int) -> tuple[float | None, float | None]:
    """One step's seconds at batch a and at b in a sweep (None where a size did not run)."""
    return tuple(None if sw.get(x, "step_ms") is None else sw.get(x, "step_ms") / 1e3 for x in (a, b))


PAIRED_NOTE = "tokens/s at {b} / at {a} in interleaved rounds: 95% CI of the median pair ratio"


def paired_gain(cmp: Any) -> Estimate:
    """% more tokens/s from a before/after of two batch sizes, each side with its own tokens per call: the
    work-normalised ratio of the paired rounds, with their interval."""
    items = cmp.after.items / cmp.before.items
    return cmp.estimate().map(lambda s: (s * items - 1) * 100)


def check_scaling(lesson: Any, sw: Sweep, paired_12_16: Any = None, util: Sweep | None = None,
                  util_rise: Estimate | None = None, paired_32_64: Any = None,
                  util_gain_8_12: Estimate | None = None, paired_seq_len: int | None = None,
                  steps_8_12: dict[int, float | None] | None = None) -> list[Claim]:
    """§6.2's and 002's claims on the sweep: utilization, sweet spot, memory, and throughput gains.

    Where they ran, paired runs decide instead of two sweep points, so that one slow window of the sweep does not
    set the interval: `paired_12_16` and `paired_32_64` (tokens/s in interleaved rounds) the "12 -> 16" and
    "32 -> 64" gains, `util` / `util_rise` (batch 8 and 64, `sweeps.round_rise`) "45% -> 92%", `util_gain_8_12`
    (`sweeps.round_gain`) "8 -> 12: 15-20% better utilization", with `steps_8_12` its rounds' step ms by batch.
    `paired_seq_len`: their sequence length. A gain between two sizes whose step times are within
    `LAUNCH_BOUND_TOLERANCE` is not tested (`launch_bound`)."""
    g, ours = sw.get, f"our sequence length {sw.seq_len} tokens (the guide states none)"
    u = util if util is not None and 8 in util.by_b and 64 in util.by_b else sw
    rise, how = difference(u.nvml(64), u.nvml(8)), ""
    if u is util and util_rise is not None:
        n = min(len(u.get(b, "round_values") or []) for b in (8, 64))
        rise, how = util_rise, f"; median of {n} interleaved rounds' differences, order-statistic interval"
    steps = (f"; step {si(u.get(8, 'step_ms') / 1e3, 's')} at 8, {si(u.get(64, 'step_ms') / 1e3, 's')} at 64"
             if u.get(8, "step_ms") and u.get(64, "step_ms") else "")
    at_sweep = (f"; the sweep at {sw.seq_len} tokens read NVML {pct(g(8, 'nvml_util'), 1)} -> "
                f"{pct(g(64, 'nvml_util'), 1)}" if u is not sw else "")
    long_len = paired_seq_len or sw.seq_len
    at_pair = f"our sequence length {long_len} tokens (the guide states none)"

    def gain(a: int, b: int, paired: Any, how: str) -> tuple[Estimate | None, str, str | None]:
        """The a -> b gain, its note, and why not where the step is launch-bound: paired rounds where they ran."""
        if paired is None:
            return sw.gain(a, b), f"sweep points, {how}; {ours}", launch_bound(a, b, *_steps_s(sw, a, b), sw.seq_len)
        return (paired_gain(paired), f"{PAIRED_NOTE.format(a=a, b=b)}; {at_pair}",
                launch_bound(a, b, paired.before.seconds, paired.after.seconds, long_len))

    g1216, n1216, lb1216 = gain(12, 16, paired_12_16, "step-time quartiles")
    g3264, n3264, lb3264 = gain(32, 64, paired_32_64, "steps' and windows' spread")
    nv, g812 = ratio(sw.nvml(12), sw.nvml(8)), sw.gain(8, 12)
    util812 = None if nv is None else nv.map(lambda x: (x - 1) * 100)
    n812 = (f"sweep points, NVML samples' quartiles; the sweep read NVML {pct(g(8, 'nvml_util'), 1)} -> "
            f"{pct(g(12, 'nvml_util'), 1)}, throughput " + (f"{g812.value:+.3g}%" if g812 else "n/a") + f"; {ours}")
    lb812 = launch_bound(8, 12, *_steps_s(sw, 8, 12), sw.seq_len)
    if util_gain_8_12 is not None:  # judged at the rounds' sequence length: the note names only that one
        s8, s12 = ((steps_8_12 or {}).get(b) for b in (8, 12))
        util812, lb812 = util_gain_8_12, launch_bound(8, 12, s8 and s8 / 1e3, s12 and s12 / 1e3, long_len)
        steps812 = f"; step {si(s8 / 1e3, 's')} at 8, {si(s12 / 1e3, 's')} at 12" if s8 and s12 and not lb812 else ""
        n812 = f"median of the interleaved rounds' gains, order-statistic interval{steps812}; {at_pair}"
    if lb812:
        lb812 += "; NVML's busy share then grows with the kernels' own time, not with how well they use the GPU"
    m8, m64 = g(8, "peak_mem_gb"), g(64, "peak_mem_gb")
    return [
        _judge(lesson, u, "util_8_64", rise, (8, 64),
               f"NVML {pct(u.get(8, 'nvml_util'), 1)} -> {pct(u.get(64, 'nvml_util'), 1)}{how}; SM active "
               f"{pct(u.get(8, 'gpm_sm_active'), 1)} -> {pct(u.get(64, 'gpm_sm_active'), 1)}{steps}; our sequence "
               f"length {u.seq_len} tokens (the guide states none){at_sweep}"),
        # 32 on the doubling grid 8, 16, 32, 64: the band runs to the geometric midpoints with 16 and 64
        _judge(lesson, sw, "sweet_spot", sw.sweet, (), f"fastest {sw.best}; within 10% of it from {sw.knee}; {ours}"),
        _judge(lesson, sw, "memory_8_64", None if m8 is None or m64 is None else m64 / m8, (8, 64),
               f"{si(m8, 'GB')} -> {si(m64, 'GB')}; the allocator's peak: an exact count; {ours}"),
        _judge(lesson, sw, "util_8_12", util812, (8, 12), n812, lb812),
        _judge(lesson, sw, "speed_12_16", g1216, (12, 16), n1216, lb1216),
        _judge(lesson, sw, "gain_32_64", g3264, (32, 64), n3264, lb3264),  # 380 -> 480: +23% to +29%
    ]


def check_batch_8_64(lesson: Any, cmp_batch: Any, b_big: int, b_small: int = 8, seq_len: int | None = None) -> Claim:
    """§6.2's 4x from batch 8 to 64, on equal work; only when 8 against 64 is what ran. Where one step of 64 takes
    about what one of 8 does (`launch_bound`), the ratio is the batch ratio by construction: not tested."""
    why = lesson.missing(*lesson.spec("speed_8_64").needs)
    if why or (b_small, b_big) != (8, 64):
        return lesson.untested("speed_8_64", why or f"this run measures batch {b_small} -> {b_big}")
    n_small = b_big // b_small
    if launch := launch_bound(b_small, b_big, cmp_batch.before.seconds / n_small, cmp_batch.after.seconds, seq_len):
        return lesson.untested("speed_8_64", f"{launch}; measured {cmp_batch.speedup:.3g}x")
    return lesson.check("speed_8_64", cmp_batch, "equal work on both sides, so the speedup is the throughput ratio"
                        + step_note(cmp_batch, n_small, seq_len))


def step_note(cmp: Any, n_small: int, seq_len: int | None) -> str:
    """The two step times of an equal-work before/after (n_small small steps against one big one), and what sets them:
    the GPU both, where the big step takes about n_small small ones (within `LAUNCH_BOUND_TOLERANCE`); otherwise the
    small step does less work than its time allows, so the host's launches set its time."""
    small_s, big_s = cmp.before.seconds / n_small, cmp.after.seconds
    at = f" at {seq_len} tokens" if seq_len else ""
    note = (f"; one step{at}: {si(small_s, 's')} small, {si(big_s, 's')} big ({big_s / small_s:.2f}x the time for "
            f"{n_small}x the work)")
    if big_s * (1 + LAUNCH_BOUND_TOLERANCE) >= n_small * small_s:
        return note + ": the GPU sets both step times"
    return note + ": the small step is launch-bound (the host's launches, not the GPU, set its time)"


def check_eighty(lesson: Any, b_top: int, b80: int, share80: Estimate, note: str) -> Claim:
    """§6.1's "80% of the max": its tokens/s over the max's ("costs little" read as within 5%: the guide gives no
    number, and 5% is the gain 002 calls worth a change)."""
    why = lesson.missing(*lesson.spec("eighty").needs)
    if why or b80 >= b_top:
        return lesson.untested("eighty", why or f"80% of {b_top} is not a smaller batch")
    return lesson.check("eighty", share80, note + "tokens/s, paired rounds")


def check_gradients(lesson: Any, checks: dict[str, dict[str, Any]]) -> list[Claim]:
    """§6.3's same gradients (GPT, float32) and its BatchNorm caveat (the CNN): numerics, tested anywhere.
    Tolerance 1e-4 relative: float32 (eps 1.2e-7) sums of thousands of terms in another order move by eps·sqrt(n)
    to eps·n; "differ" means ten times that."""
    gpt32, gpt64, cnn = checks["GPT, float32"], checks["GPT, float64"], checks["CNN with BatchNorm, float32"]
    return [lesson.check("grads_same", gpt32["rel_diff"], "GPT without dropout; tolerance: float32 rounding of "
                         f"reordered sums; float64 gives {gpt64['rel_diff']:.1e}"),
            lesson.check("batchnorm", cnn["rel_diff"], "threshold: 10x the float32 same-gradient tolerance (1e-4)")]


def check_accumulation(lesson: Any, slow_est: Estimate, b_acc: int, accum: int, mem_big: float | None,
                       mem_acc: float | None) -> list[Claim]:
    """§6.3's cost (slower) and gain (3x less memory) of accumulating, on the batch that ran."""
    slower = lesson.check("accum_slower", slow_est, f"B={b_acc}, {accum} micro-batches of {b_acc // accum}")
    why = lesson.missing(*lesson.spec("accum_memory").needs)
    if why or not mem_big:
        return [slower, lesson.untested("accum_memory", why or "peak memory not measured (no CUDA allocator)")]
    return [slower, lesson.check("accum_memory", mem_big / mem_acc, f"B={b_acc}, micro-batch {b_acc // accum}; the "
                                 "allocator's peaks: exact counts, no spread")]


def _other(lesson: Any, key: str, proxy: Any, reason: str) -> Claim:
    """Our figure beside another system's (not comparable); without a GPU run there is no figure to show."""
    why = lesson.missing(*lesson.spec(key).needs)
    if why is None and proxy is not None:
        return lesson.not_comparable(key, proxy, reason)
    return lesson.untested(key, why or "not measured in this run")


def record_the_rest(lesson: Any, sw: Sweep, *, max_fitting: int, b_top: int, mem_top: float | None, b_acc: int,
                    mem_big: float | None, mem_acc: float | None, seq_len: int) -> list[Claim]:
    """The claims this notebook cannot check: training dynamics, and numbers of other models and GPUs."""
    at8 = sw.rates[8].map(lambda t: t / sw.seq_len) if 8 in sw.rates else None
    top = max(sw.by_b)
    return [
        lesson.untested("convergence", "training dynamics: needs training to convergence both ways; section 6 "
                                       "tests one step's gradients"),
        _other(lesson, "oom_128", max_fitting, f"{THEIRS}; ours: the largest batch that fits ({seq_len} tokens)"),
        _other(lesson, "batch8_figures", at8, f"{THEIRS}; ours at batch 8, {sw.seq_len} tokens: samples/s (shown), "
                                              f"{si(sw.get(8, 'peak_mem_gb'), 'GB')}"),
        _other(lesson, "accum_gb", mem_acc, f"the guide's model; ours: {si(mem_acc, 'GB')} accumulated (shown), "
                                            f"{si(mem_big, 'GB')} as one batch of {b_acc}"),
        _other(lesson, "max_safe_12", b_top, f"{GEMMA}; ours: the largest batch that ran ({seq_len} tokens)"),
        _other(lesson, "memory_18_20", mem_top, f"{GEMMA}; ours: peak at batch {b_top} of "
                                                f"{si(lesson.device.memory_gb, 'GB')}"),
        _other(lesson, "usage_92_95", sw.nvml(top), f"another model and GPU after a dozen changes; ours: NVML at "
                                                    f"batch {top}, {sw.seq_len} tokens"),
    ]


# ---------------------------------------------------------------- figures (they draw; they record nothing)

def sweep_figures(sw: Sweep, lesson: Any, cfg: Any, sim_memory_mb: float | None) -> None:
    """Throughput, three levels of utilization, and memory over batch size; the reference run's beside."""
    import matplotlib.pyplot as plt

    from ..display import plots
    ok, gpu, axis = sw.ok, lesson.gpu, f"batch size (sequences of {sw.seq_len} tokens)"
    xs = [r["batch_size"] for r in ok]
    ref_rows = [r for r in (lesson.reference or {}).get("extra", {}).get("batch_sweep", []) if not r.get("oom")]
    ref_seq = ((lesson.reference or {}).get("extra", {}).get("batch_scaling") or {}).get("seq_len")
    ref_rows = ref_rows if ref_seq == sw.seq_len else []  # another sequence length is another workload

    def ref(key: str, scale: float = 1.0) -> Any:
        return ([r["batch_size"] for r in ref_rows], column(ref_rows, key, scale)) if ref_rows else None

    figs = [plots.sweep(xs, {"samples/s": column(ok, "samples_per_s")}, xlabel=axis, ylabel="samples/s", logx=True,
                        ref={"samples/s": ref("samples_per_s")} if ref_rows else None, title="throughput")]
    levels = {"MFU (%)": column(ok, "mfu", 100), "GPU busy, NVML (%)": column(ok, "nvml_util"),
              "SM active, GPM (%)": column(ok, "gpm_sm_active"), "tensor active, GPM (%)": column(ok, "gpm_tensor_active")}
    if not gpu:
        levels["host CPU (%)"] = column(ok, "cpu_percent")
    figs.append(plots.sweep(xs, levels, xlabel=axis, ylabel="percent", logx=True, title="utilization",
                            ref={"MFU (%)": ref("mfu", 100)} if ref_rows else None))
    ax = figs[-1].axes[0]
    ax.set_ylim(-3, 105)
    for line in ax.lines:  # MFU and tensor activity often coincide: dashed on top, so neither hides the other
        if line.get_label() == "MFU (%)":
            line.set(ls="--", marker="s", ms=3.5, zorder=3)
    ax.legend(fontsize=8)  # redrawn, so that its MFU entry is dashed too
    if gpu:
        mem = {"peak memory allocated (GB)": column(ok, "peak_mem_gb")}
        hl = {f"device memory, {si(lesson.device.memory_gb, 'GB')}": lesson.device.memory_gb}
    else:
        mem = {"estimated step memory (MB)": [gpt_step_memory_estimate(cfg, b, sw.seq_len) / 2**20 for b in xs]}
        hl = {f"simulated limit, {sim_memory_mb} MB": sim_memory_mb}
    figs.append(plots.sweep(xs, mem, xlabel=axis, ylabel="GB" if gpu else "MB", hlines=hl, title="memory",
                            ref={"peak memory allocated (GB)": ref("peak_mem_gb")} if ref_rows and gpu else None))
    for f in figs:
        f.tight_layout()
    plt.show()


def grad_figure(checks: dict[str, dict[str, Any]]) -> None:
    """Bars of the relative gradient difference per model, on a log scale."""
    import matplotlib.pyplot as plt

    from ..display import plots
    plots.bars([k.replace(", ", "\n") for k in checks], [v["rel_diff"] for v in checks.values()],
               ylabel="relative difference (log)", fmt="{:.2e}", title="one batch of 128 vs 4 micro-batches of 32")
    plt.gca().set_yscale("log")
    plt.gcf().tight_layout()
    plt.show()
