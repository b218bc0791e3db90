"""Notebook 06's claims as data (guide §6 and the optimization review's batch-size claims), the sweep read by batch
size (`Sweep`), and the functions that judge each claim on what the notebook measured.

    sw = Sweep(rows, runs, max_fitting=MAXB, seq_len=SEQ_LEN)
    display(*check_scaling(lesson, sw))      # each claim recorded with its verdict, or "not tested" and why

What a claim needs (a CUDA GPU, the full sizes) is declared with it; a claim about batch sizes the sweep did not
reach says which. Nothing here times anything.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..batchsize import sweet_spot, trace_estimate
from ..claims import Claim, Estimate, difference, ratio
from .data_lab import knee

__all__ = ["CLAIMS", "claims", "Sweep", "pct", "check_scaling", "check_batch_8_64", "check_eighty",
           "check_gradients", "check_accumulation_cost", "record_the_rest"]

GPU = ("cuda", "full")  # a GPU at the full sizes: what every speed, memory and utilization claim stands on
THEIRS = "the guide's model and GPU"
GEMMA = "Gemma-1B on an RTX 3090"

# The guide's §6 claims and 002_'s, in the order the notebook checks them. Bands are unchanged from the notebook's
# earlier versions; the comments beside the checks below say where each comes from.
CLAIMS = [
    dict(key="util_8_64", text="GPU utilization rises with batch size, 45% at batch 8 to 92% at batch 64; measured: "
         "NVML percentage points gained from 8 to 64", low=35, high=60, unit="points", source="guide §6.2",
         needs=GPU),
    dict(key="sweet_spot", text="the sweet spot is batch 32; measured: last batch before a bigger one gains "
         "relatively less throughput than it adds memory (the rule that gives 32 on the guide's table)", low=24,
         high=48, unit="sequences", source="guide §6.2", needs=GPU),
    dict(key="memory_8_64", text="memory grows with batch size, 12 GB at batch 8 to 45 GB at batch 64 (3.75x); "
         "measured: peak memory ratio 64 / 8", low=2.8, high=4.7, source="guide §6.2", needs=GPU),
    dict(key="util_8_12", text="batch 8 -> 12: 15-20% better GPU utilization; measured: relative NVML gain",
         low=15, high=20, unit="%", source="002_ fix 4", needs=GPU),
    dict(key="speed_12_16", text="batch 12 -> 16: 5-10% faster; measured: throughput gain", low=5, high=10,
         unit="%", source="002_ remaining optimizations", needs=GPU),
    dict(key="gain_32_64", text="from batch 32 to 64 throughput gains ~26% (380 -> 480 samples/s); measured: "
         "throughput gain", low=23, high=29, unit="%", source="guide §6.2", needs=GPU),
    dict(key="speed_8_64", text="throughput rises 4x from batch 8 to batch 64 (120 -> 480 samples/s)", low=3,
         high=5, source="guide §6.2", needs=GPU),
    dict(key="eighty", text="80% of the maximum batch is a safe choice that costs little; measured: its throughput "
         "/ the maximum's, both run in paired rounds ('little': within 5%)", low=0.95, source="guide §6.1",
         needs=GPU),
    dict(key="grads_same", text="accumulating 32 x 4 gives the same gradient update as batch 128; measured: "
         "relative L2 difference of the gradients (float32)", high=1e-4, unit="relative", source="guide §6.3"),
    dict(key="batchnorm", text="con: batch norm statistics are computed on micro-batches, so BatchNorm models "
         "differ; measured: relative gradient difference of a CNN with BatchNorm", low=1e-3, unit="relative",
         source="guide §6.3"),
    None,  # accum_slower: its text names ACCUM_STEPS, see claims()
    dict(key="accum_memory", text="accumulation saves memory: batch 128 needs 48 GB, 32 x 4 needs 16 GB (3x less); "
         "measured: peak memory ratio, one batch / accumulated", low=2.4, high=3.6, source="guide §6.3", needs=GPU),
    dict(key="convergence", text="pro: same convergence as the large batch", low=1.0, high=1.0,
         source="guide §6.3"),
    dict(key="oom_128", text="batch 128 runs out of memory (64 fits)", low=64, high=127, unit="sequences",
         source="guide §6.2", needs=GPU),
    dict(key="batch8_figures", text="batch 8 uses 12 GB and trains 120 samples/s", low=120, high=120,
         unit="samples/s", source="guide §6.2", needs=GPU),
    dict(key="accum_gb", text="batch 128 needs 48 GB, 32 x 4 accumulated needs 16 GB", low=16, high=48, unit="GB",
         source="guide §6.3", needs=GPU),
    dict(key="max_safe_12", text="batch 12 is the maximum safe batch (RTX 3090, 24 GB)", low=12, high=12,
         unit="sequences", source="002_", needs=GPU),
    dict(key="memory_18_20", text="memory usage 18-20 GB of 24 GB at the chosen batch", low=18, high=20, unit="GB",
         source="002_", needs=GPU),
    dict(key="usage_92_95", text="expected GPU usage 92-95% after all the changes", low=92, high=95, unit="%",
         source="002_", needs=GPU),
]


def claims(accum_steps: int) -> list[dict[str, Any]]:
    """The claims for `gl.lesson`, the accumulation-speed one worded for `accum_steps` micro-batches."""
    # the guide says "slower", with no size: the band is more than 1x
    slower = dict(key="accum_slower", text=f"con: {accum_steps}x more forward passes make accumulation slower; "
                  f"measured: time of {accum_steps} x B/{accum_steps} over one batch B", low=1.0,
                  source="guide §6.3", needs=GPU)
    return [dict(c) if c is not None else slower for c in CLAIMS]


def pct(v: float | None, scale: float = 1.0, nd: int = 0) -> str:
    """A percentage for a table or sentence ("n/a" for a reading this run does not have)."""
    return "n/a" if v is None else f"{v * scale:.{nd}f}%"


@dataclass
class Sweep:
    """The timed sweep read by batch size: its rows that ran, throughput with intervals, peak memory, best,
    knee and sweet spot."""

    rows: list[dict[str, Any]]
    runs: dict[int, Any]
    max_fitting: int
    seq_len: int
    ok: list[dict[str, Any]] = field(init=False)

    def __post_init__(self) -> None:
        self.ok = [r for r in self.rows if not r["oom"]]
        self.by_b = {r["batch_size"]: r for r in self.ok}
        self.thr = {b: r["samples_per_s"] for b, r in self.by_b.items()}
        # tokens/s, interval from the step time's quartiles
        self.rates = {b: self.runs[b].throughput_estimate() for b in self.by_b}
        self.mem = {b: r["peak_mem_gb"] for b, r in self.by_b.items() if r["peak_mem_gb"]}
        self.best = max(self.thr, key=self.thr.get)
        self.knee = knee(self.thr, 0.90)  # smallest batch within 10% of the best throughput
        # §6.2's sweet spot, read off the guide's own table (gpulab.batchsize)
        self.sweet = sweet_spot(list(self.by_b), self.rates, self.mem)

    def get(self, b: int, key: str) -> Any:
        """Column `key` of batch `b`'s row (None if batch `b` did not run)."""
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
        return dict(best=self.best, knee_90=self.knee, max_fitting=self.max_fitting,
                    sweet_spot=None if s is None else [s.value, s.lo, s.hi])


def _judge(lesson: Any, sw: Sweep, key: str, value: Any, batches: tuple[int, ...] = (), note: str = "") -> Claim:
    """Check on a GPU run when the batch sizes the claim is about were measured; otherwise say why not."""
    why = lesson.missing(*lesson.spec(key).needs)
    missing = [b for b in batches if b not in sw.by_b]
    if why:
        return lesson.untested(key, why)
    if missing:
        return lesson.untested(key, f"batch {', '.join(map(str, missing))} not measured: it does not fit, or ran "
                                    f"out of memory in the sweep (largest in the search: {sw.max_fitting})")
    if value is None:
        return lesson.untested(key, "not measured on this GPU (NVML or GPM unavailable)")
    return lesson.check(key, value, note)


def check_scaling(lesson: Any, sw: Sweep, paired_12_16: Any = None) -> list[Claim]:
    """§6.2's and 002_'s claims on the sweep: utilization, sweet spot, memory, and throughput gains.

    `paired_12_16` (batch 12 against 16 in interleaved rounds) decides "12 -> 16" where it ran: its band sits a few
    percent from the result, closer than two separately timed sweep points can tell apart."""
    g = sw.get
    g1216, n1216 = sw.gain(12, 16), "sweep points, step-time quartiles"
    if paired_12_16 is not None:
        g1216 = paired_12_16.estimate().map(lambda s: (s * 16 / 12 - 1) * 100)
        n1216 = "batch 12 against 16 in interleaved rounds: a 95% interval of their median throughput ratio"
    nv = ratio(sw.nvml(12), sw.nvml(8))
    m8, m64 = g(8, "peak_mem_gb"), g(64, "peak_mem_gb")
    g812 = sw.gain(8, 12)
    return [
        # 47 points in the table; band 35-60
        _judge(lesson, sw, "util_8_64", difference(sw.nvml(64), sw.nvml(8)), (8, 64),
               f"NVML {pct(g(8, 'nvml_util'))} -> {pct(g(64, 'nvml_util'))}; SM active "
               f"{pct(g(8, 'gpm_sm_active'))} -> {pct(g(64, 'gpm_sm_active'))}"),
        # 32 on the doubling grid 8, 16, 32, 64: the band runs to the geometric midpoints with 16 and 64 (22.6, 45.3)
        _judge(lesson, sw, "sweet_spot", sw.sweet, (), f"fastest {sw.best}; within 10% of it from {sw.knee}"),
        # 3.75x +-25%
        _judge(lesson, sw, "memory_8_64", None if m8 is None or m64 is None else m64 / m8, (8, 64),
               f"{m8 or 0:.1f} GB -> {m64 or 0:.1f} GB; the allocator's peak: an exact count, no spread"),
        _judge(lesson, sw, "util_8_12", None if nv is None else nv.map(lambda x: (x - 1) * 100), (8, 12),
               f"NVML {pct(g(8, 'nvml_util'))} -> {pct(g(12, 'nvml_util'))}; throughput "
               + (f"{g812.value:+.0f}%" if g812 else "n/a")),
        _judge(lesson, sw, "speed_12_16", g1216, (12, 16), n1216),
        # 380 -> 480 read as 375-385 -> 475-485: +23% to +29%
        _judge(lesson, sw, "gain_32_64", sw.gain(32, 64), (32, 64)),
    ]


def check_batch_8_64(lesson: Any, cmp_batch: Any, b_big: int, max_fitting: int) -> Claim:
    """§6.2's 4x from batch 8 to 64, on equal work; only when batch 64 is what ran."""
    # 4x in the table (120 -> 480); band +-25%: the table's figures are round numbers of another model
    why = lesson.missing(*lesson.spec("speed_8_64").needs)
    if why or b_big != 64:
        return lesson.untested("speed_8_64", why or f"batch 64 does not fit (largest: {max_fitting})")
    return lesson.check("speed_8_64", cmp_batch,
                        f"equal work on both sides, so the speedup is the throughput ratio; {cmp_batch.verdict}")


def check_eighty(lesson: Any, sw: Sweep, b_top: int, b80: int, share80: Estimate, top_note: str) -> Claim:
    """§6.1's "80% of the max": its throughput share, when 80% is a smaller batch than the max that ran."""
    # "costs little" read as within 5%: the guide gives no number, and 5% is the gain 002_ calls worth a change
    return _judge(lesson, sw, "eighty", share80 if b80 < b_top else None, (b_top,),
                  top_note + "interval from the paired rounds")


def check_gradients(lesson: Any, checks: dict[str, dict[str, Any]]) -> list[Claim]:
    """§6.3's same gradients (GPT, float32) and its BatchNorm caveat (the CNN): numerics, tested anywhere."""
    gpt32, gpt64 = checks["GPT, float32"], checks["GPT, float64"]
    cnn = checks["CNN with BatchNorm, float32"]
    # Numerics, not timing: seeded and deterministic, so a zero-width interval. The tolerance 1e-4 (relative L2):
    # float32 keeps 24 bits (eps 1.2e-7), and adding thousands of terms in another order moves a sum by about
    # eps·sqrt(n) to eps·n, i.e. 1e-6 to 1e-4 relative; float64 (eps 2.2e-16) shows the difference is rounding.
    same = lesson.check("grads_same", gpt32["rel_diff"], (
        f"GPT without dropout; tolerance: float32 rounding of reordered sums (eps 1.2e-7 x sqrt(n) to n terms); "
        f"float64 gives {gpt64['rel_diff']:.1e}"))
    # "differ" means: beyond rounding, by ten times the same-gradient tolerance above
    bn = lesson.check("batchnorm", cnn["rel_diff"], "threshold: 10x the float32 same-gradient tolerance (1e-4)")
    return [same, bn]


def check_accumulation_cost(lesson: Any, cmp_accum: Any, slow_est: Estimate, b_acc: int, micro: int,
                            mem_big: float | None, mem_acc: float | None) -> list[Claim]:
    """§6.3's cost (slower) and gain (3x less memory) of accumulating, on the batch that ran."""
    slower = lesson.check("accum_slower", slow_est, f"B={b_acc}; {cmp_accum.verdict}")
    why = lesson.missing(*lesson.spec("accum_memory").needs)
    if why or not mem_big:  # 3x +-20%
        memory = lesson.untested("accum_memory", why or "peak memory not measured (no CUDA allocator)")
    else:
        memory = lesson.check("accum_memory", mem_big / mem_acc,
                              f"B={b_acc}, micro-batch {micro}; the allocator's peaks: exact counts, no spread")
    return [slower, memory]


def _other(lesson: Any, key: str, proxy: Any, reason: str) -> Claim:
    """Our figure beside another system's (not comparable); without a GPU run there is no figure to show."""
    why = lesson.missing(*lesson.spec(key).needs)
    if why is None and proxy is not None:
        return lesson.not_comparable(key, proxy, reason)
    return lesson.untested(key, why or "not measured in this run")


def record_the_rest(lesson: Any, sw: Sweep, *, b_top: int, b_acc: int, mem_big: float | None,
                    mem_acc: float | None, model: str) -> list[Claim]:
    """The claims this notebook cannot check: training dynamics, and numbers of other models and GPUs."""
    top = sw.by_b.get(b_top, {})
    at8 = sw.rates[8].map(lambda t: t / sw.seq_len) if 8 in sw.rates else None
    memory_gb = lesson.device.memory_gb or 0
    return [
        lesson.untested("convergence", "training dynamics: needs training to convergence both ways; section 6 "
                                       "tests one step's gradients"),
        _other(lesson, "oom_128", sw.max_fitting,
               f"{THEIRS}; ours: the largest batch that fits ({model}, {sw.seq_len} tokens)"),
        _other(lesson, "batch8_figures", at8,
               f"{THEIRS}; ours at batch 8: samples/s (shown), {sw.get(8, 'peak_mem_gb') or 0:.1f} GB"),
        _other(lesson, "accum_gb", mem_acc, f"the guide's model; ours: {mem_acc or 0:.1f} GB accumulated (shown), "
                                            f"{mem_big or 0:.1f} GB as one batch of {b_acc}"),
        _other(lesson, "max_safe_12", b_top, f"{GEMMA}; ours: the largest batch that ran in the sweep"),
        _other(lesson, "memory_18_20", top.get("peak_mem_gb"),
               f"{GEMMA}; ours: peak at batch {b_top} of {memory_gb:.0f} GB"),
        _other(lesson, "usage_92_95", sw.nvml(b_top),
               f"another model and GPU after a dozen changes; ours: NVML at batch {b_top}"),
    ]
