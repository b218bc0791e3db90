"""Notebook 05's claims as data (guide §5 and the companion notes on data loading), and the functions that judge
each one on what the notebook measured: worker scaling, the guide's two conditional rules, the sawtooth, the data
wait, the loader knobs, pinned memory, the prefetcher, and the numbers that belong to another system.

    display(*check_workers(lesson, rates, cores=CORES, rule_of_thumb=RULE_OF_THUMB))

The pipeline claims are about feeding a GPU at real sizes: `why_not(lesson)` says why a run cannot test them (no
CUDA GPU, or smoke sizes). Nothing here times anything.
"""
from __future__ import annotations

from typing import Any, Sequence

from ..batchsize import trace_estimate
from ..claims import Claim, Estimate, ratio
from .data_lab import knee_estimate, share_of_best, workers

__all__ = ["CLAIMS", "NO_GPU", "SMOKE_SIZES_WHY", "workers", "why_not", "check_workers", "check_rules",
           "check_sawtooth", "check_data_wait", "check_prefetch_factor", "check_persistent", "check_pinned",
           "check_prefetcher", "record_the_rest"]

NO_GPU = "needs a CUDA GPU (here the model trains on the same CPU cores the workers use); see the reference run"
SMOKE_SIZES_WHY = "smoke sizes are too small to time a data pipeline; run with SMOKE=False"
NO_GPU_SHORT = "needs a CUDA GPU; see the reference run"  # pinned memory and the prefetcher: nothing ran on a CPU
PIPE = "samples over the windows' wall time (pipeline); interval from the windows' spread"
PAIRED = ("all cores' workers / half the cores', in interleaved windows; interval: 95% CI of the median window-pair "
          "ratio")
PAIRED_FOUR = ("4 workers / none, in interleaved windows; interval: 95% CI of the median window-pair ratio")
PAIRED_KNEE = ("fewest workers within 5% of the best, as a fraction of the cores; the sweep's spread, narrowed by "
               "the interleaved all / half ratio")
GPU_FULL = ("cuda", "full")

# The guide's §5.4 table (8 cores): 15.2, 8.5, 5.2, 3.1, 3.0, 3.2 s for 0, 1, 2, 4, 8, 16 workers. Directions
# with no size ("helps", "faster", "avoids") get the band "more than 1x".
CLAIMS = [
    dict(key="four_vs_zero", text="4 workers load ~5x faster than num_workers=0 (15.2 s -> 3.1 s for 100 batches on "
         "8 cores)", low=4, high=6, source="guide §5.4", needs=GPU_FULL),  # 4.9x in the table; ~5 read as 4-6
    dict(key="half_cores", text="the optimum is at about half the cores (4 workers on 8 cores); measured: fewest "
         "workers within 5% of the best, as a fraction of the cores", low=0.4, high=0.6, unit="of the cores",
         source="guide §5.4", needs=GPU_FULL),  # 4 of 8 = 0.5; the next powers of two give 0.25 and 1
    dict(key="past_half", text="past half the cores, more workers add little (3.1 s -> 3.0 s from 4 to 8 workers on "
         "8 cores); measured: throughput with all cores / with half", low=0.95, high=1.05, source="guide §5.4",
         needs=GPU_FULL),  # 3.1 / 3.0 = 1.03: "little" as within 5% either way
    dict(key="rule_of_thumb", text="rule of thumb num_workers = min(cores, 8) gets the best throughput (within 5%); "
         "measured: its throughput / the best", low=0.95, source="guide §5.4", needs=GPU_FULL),
    dict(key="eight_vs_four", text="8 workers instead of 4: 5-10% data loading speedup", low=5, high=10, unit="%",
         source="002_ fix 5", needs=GPU_FULL),
    dict(key="rule_util", text="if GPU utilization is below 70% (at 4 workers), increase to 8; measured: throughput "
         "8 / 4 workers when NVML reads under 70% at 4", low=1.0, source="guide §5.4", needs=GPU_FULL),
    dict(key="rule_cpu", text="if host CPU use is above 90%, decrease num_workers; measured: throughput with half the "
         "workers / with the first count above 90%", low=1.0, source="guide §5.4", needs=GPU_FULL),
    dict(key="sawtooth", text="a starved loop leaves the GPU idle between short bursts (the sawtooth); measured: NVML "
         "GPU busy with num_workers=0", high=50, unit="%", source="004_", needs=GPU_FULL),  # idle > busy
    dict(key="wait_ratio", text="data loading: 45 ms -> 8 ms per iteration (5.6x); measured: data wait per batch, "
         "starved / fed", low=5.2, high=6.1, source="003_", needs=GPU_FULL),  # 44.5-45.5 / 7.5-8.5 ms: 5.2-6.1x
    dict(key="wait_ms", text="data loading takes 45 ms per iteration before and 8 ms after", low=8, high=45,
         unit="ms", source="003_"),
    dict(key="prefetch_factor", text="prefetch_factor=4 helps (vs the default 2); measured: throughput ratio of the "
         "fed loop", low=1.0, source="000_, 002_", needs=GPU_FULL),
    dict(key="persistent", text="persistent_workers=True avoids the worker respawn overhead between epochs; "
         "measured: epoch-start time respawned / persistent", low=1.0, source="guide §5.1, 002_"),  # any machine
    dict(key="pin_copy", text="pin_memory: faster CPU->GPU transfer; measured: copy bandwidth pinned / pageable",
         low=1.0, source="guide §5.1-5.2, 002_", needs=GPU_FULL),
    dict(key="pin_loop", text="pin_memory=True makes the training loop faster; measured: loop speedup with pinned "
         "batches", low=1.0, source="guide §5.1, 002_", needs=GPU_FULL),
    dict(key="prefetcher", text="the prefetcher overlaps the next batch's copy with compute, so the loop runs "
         "faster; measured: throughput ratio, prefetcher / plain loop", low=1.0, source="guide §5.3",
         needs=GPU_FULL),
    dict(key="cpu_usage", text="expected CPU usage 60-80% across all cores (8 workers, prefetch_factor=4)", low=60,
         high=80, unit="%", source="002_"),
    dict(key="prefetch_distance", text="prefetch distance: optimal 6-8 for typical kernels", low=6, high=8,
         unit="stages", source="000_"),
    dict(key="samples_160", text="samples/second ~160, up from ~40 (4x) after the note's changes", low=4, high=4,
         source="002_"),
    dict(key="batches_3_1s", text="100 batches take 3.1 s with 4 workers on 8 cores", low=3.1, high=3.1, unit="s",
         source="guide §5.4"),
    dict(key="sixteen_workers", text="16 workers on 8 cores: overhead increases (3.0 s -> 3.2 s)", high=1.0,
         source="guide §5.4"),
    dict(key="ready_batches", text="4 workers x prefetch_factor 2 = 8 batches ready in total", low=8, high=8,
         unit="batches", source="guide §5.1", evidence="definition"),
]


def why_not(lesson: Any) -> str | None:
    """Why this run cannot test the pipeline claims (they are about feeding a GPU at real sizes), or None."""
    if not lesson.small:  # a CUDA GPU at full sizes
        return None
    return NO_GPU if not lesson.gpu else SMOKE_SIZES_WHY


def _judge(lesson: Any, key: str, value: Any, note: str = "", **kw: Any) -> Claim:
    """Check claim `key`, or mark it not tested with this notebook's own reason (smoke sizes, no GPU)."""
    why = why_not(lesson)
    return lesson.untested(key, why) if why else lesson.check(key, value, note, **kw)


def check_workers(lesson: Any, rates: dict[int, Estimate], *, cores: int, rule_of_thumb: int,
                  all_over_half: Estimate | None = None, four_over_zero: Estimate | None = None) -> list[Claim]:
    """Judge §5.4's worker table by its shape: 4 vs 0 workers, the knee at half the cores, little gain past it,
    min(cores, 8), and 8 vs 4; each on the steady-state rates with the windows' spread.

    `all_over_half` is the rate with all the cores' workers over that with half, from interleaved windows (drift
    on a shared host cancels in each pair). Where given it decides the three claims that turn on those two counts
    (past half, the knee, min(cores, 8) when that is half), in place of two separately measured rates.
    `four_over_zero`, the rate with 4 workers over that with none from interleaved windows, decides "4 workers
    ~5x" the same way."""
    half = max(1, cores // 2)
    knee_est = paired_knee(knee_estimate(rates, 0.95), rates, all_over_half, half, cores)

    def r(a: int, b: int) -> Estimate | None:
        """Rate with `a` workers over rate with `b`, with its interval (None if either count was not swept)."""
        return ratio(rates.get(a), rates.get(b))

    past, thumb, note = r(cores, half), share_of_best(rates, rule_of_thumb), {}
    if all_over_half is not None and cores > half:
        past, note["past_half"] = all_over_half, PAIRED
        best = max(rates, key=lambda k: rates[k].value) if rates else None
        if rule_of_thumb == half and best in (half, cores):  # the best is one of the pair: its share is paired too
            thumb, note["rule_of_thumb"] = all_over_half.map(lambda v: min(1.0, 1 / v)), PAIRED
        note["half_cores"] = PAIRED_KNEE
    four = r(4, 0)
    if four_over_zero is not None:
        four, note["four_vs_zero"] = four_over_zero, PAIRED_FOUR
    r84 = r(8, 4)
    table = [("four_vs_zero", four, cores >= 4),
             ("half_cores", knee_est.map(lambda k: k / cores) if knee_est else None, cores >= 4),
             ("past_half", past, cores >= 4),
             ("rule_of_thumb", thumb, True),
             ("eight_vs_four", None if r84 is None else r84.map(lambda v: (v - 1) * 100), cores >= 8)]
    out = []
    for key, value, possible in table:
        if why_not(lesson):
            out.append(lesson.untested(key, why_not(lesson)))
        elif not possible or value is None:
            text = lesson.spec(key).text
            out.append(lesson.untested(key, f"needs at least {8 if '8 workers' in text else 4} cores; "
                                            f"this host has {cores}"))
        else:
            out.append(lesson.check(key, value, note.get(key, PIPE), measurement="utilization_by_workers"))
    return out


def paired_knee(knee_est: Estimate | None, rates: dict[int, Estimate], all_over_half: Estimate | None, half: int,
                cores: int, fraction: float = 0.95) -> Estimate | None:
    """The knee's interval narrowed by the paired all/half ratio: where half is surely within 5% of all, the knee
    is at most half; where half is surely more than 5% short, it lies above half (the next swept count or more)."""
    if knee_est is None or all_over_half is None or cores <= half:
        return knee_est
    if all_over_half.hi < 1 / fraction:
        lo = min(knee_est.lo, half)
        return Estimate(min(knee_est.value, half), lo, min(knee_est.hi, half))
    if all_over_half.lo > 1 / fraction:
        above = min((k for k in rates if k > half), default=cores)
        return Estimate(max(knee_est.value, above), max(knee_est.lo, above), max(knee_est.hi, above))
    return knee_est


def check_rules(lesson: Any, util: Sequence[tuple[int, Any]], util_rows: Sequence[dict[str, Any]],
                rates: dict[int, Estimate], cores: int) -> list[Claim]:
    """Judge §5.4's two conditional rules, each only where its condition holds in this run (NVML under 70% at 4
    workers; host CPU over 90%); otherwise the claim says what the reading was."""
    why = why_not(lesson)
    u4 = trace_estimate(dict(util).get(4), "nvml_util")
    if why or cores < 8 or u4 is None:
        util_claim = lesson.untested("rule_util", why or "needs 8 cores and NVML utilization at 4 workers")
    elif u4.hi >= 70:
        util_claim = lesson.untested("rule_util", f"the rule's condition does not hold: NVML reads {u4.value:.0f}% "
                                                  f"[{u4.lo:.0f}, {u4.hi:.0f}] at 4 workers")
    else:
        util_claim = lesson.check("rule_util", ratio(rates.get(8), rates.get(4)),
                                  f"NVML at 4 workers {u4.value:.0f}% [{u4.lo:.0f}, {u4.hi:.0f}]",
                                  measurement="utilization_by_workers")
    busy = [r for r in util_rows if r["num_workers"] > 0 and (r["cpu_percent"] or 0) > 90]
    if why:
        cpu_claim = lesson.untested("rule_cpu", why)
    elif not busy or busy[0]["num_workers"] // 2 not in rates:
        top = max((r["cpu_percent"] or 0) for r in util_rows)
        cpu_claim = lesson.untested("rule_cpu", f"the rule's condition never holds here: host CPU at most "
                                                f"{top:.0f}% over the worker counts swept")
    else:
        w90 = busy[0]["num_workers"]
        cpu_claim = lesson.check("rule_cpu", ratio(rates.get(w90 // 2), rates.get(w90)),
                                 f"{workers(w90)}: host CPU {busy[0]['cpu_percent']:.0f}%",
                                 measurement="utilization_by_workers")
    return [util_claim, cpu_claim]


def pct(v: float | None, scale: float = 1.0) -> str:
    """A percentage for a sentence or table ("n/a" for a reading this run does not have)."""
    return "n/a" if v is None else f"{v * scale:.0f}%"


def check_sawtooth(lesson: Any, cmp_feed: Any) -> Claim:
    """The sawtooth (004_): NVML's busy share of the starved loop, with the quartiles of its samples."""
    b, a = cmp_feed.before, cmp_feed.after
    why = why_not(lesson)
    if why or b.metric("nvml_util") is None:
        return lesson.untested("sawtooth", why or "NVML utilization not available on this GPU")
    bp = b.profile.busy_fraction if b.profile else None
    return lesson.check("sawtooth", trace_estimate(b, "nvml_util"),
                        f"interval: quartiles of NVML's samples; profiler busy fraction {pct(bp, 100)}; "
                        f"fed: {pct(a.metric('nvml_util'))}")


def check_data_wait(lesson: Any, wait_b: Estimate, wait_a: Estimate, w_fed: int) -> list[Claim]:
    """The case study's 45 ms -> 8 ms (003_): its ratio judged on our data wait, its milliseconds not comparable."""
    return [_judge(lesson, "wait_ratio", ratio(wait_b, wait_a), f"0 vs {workers(w_fed)}; interval from the "
                   "windows' range", measurement="starved vs fed"),
            lesson.not_comparable("wait_ms", wait_a.map(lambda s: s * 1e3),
                                  f"the case study's own data and model; ours: {wait_b.value * 1e3:.1f} ms starved, "
                                  f"{wait_a.value * 1e3:.2f} ms fed (shown)")]


def check_prefetch_factor(lesson: Any, pf_gain: Estimate, w_fed: int) -> Claim:
    """prefetch_factor 4 against 2 on the fed loop (000_, 002_)."""
    return _judge(lesson, "prefetch_factor", pf_gain, f"{workers(w_fed)}; samples over the windows' wall time")


def check_persistent(lesson: Any, starts: Any, w_fed: int) -> Claim:
    """persistent_workers (§5.1): epoch start respawned / persistent, on any machine (process start-up is CPU)."""
    resp, pers = starts.later_epochs("respawn"), starts.later_epochs("persistent")
    return lesson.check("persistent", starts.ratio_estimate(), f"{resp * 1e3:.0f} ms vs {pers * 1e3:.0f} ms, "
                        f"{workers(w_fed)}; interval from the epochs' quartiles")


def _gpu_only(lesson: Any, key: str, cmp: Any, value: Any, note: str) -> Claim:
    """A claim measured only with CUDA (pinned memory, the prefetcher): checked on a full-size GPU run."""
    if cmp is not None and not lesson.small:
        return lesson.check(key, value, note)
    return lesson.untested(key, NO_GPU_SHORT if not lesson.gpu else SMOKE_SIZES_WHY)


def check_pinned(lesson: Any, cmp_copy: Any, cmp_pin_loop: Any) -> list[Claim]:
    """Pinned memory (§5.1-5.2): the copy's bandwidth and the loop, each pinned against pageable."""
    return [_gpu_only(lesson, key, cmp, cmp, cmp.verdict if cmp is not None else "")
            for key, cmp in (("pin_copy", cmp_copy), ("pin_loop", cmp_pin_loop))]


def check_prefetcher(lesson: Any, cmp_prefetch: Any, pre_gain: Estimate | None, copy_share: float | None) -> Claim:
    """The side-stream prefetcher (§5.3): throughput with it over the plain loop's, the copy's share beside it."""
    note = f"the copy is {copy_share:.1%} of a step" if copy_share is not None else ""
    return _gpu_only(lesson, "prefetcher", cmp_prefetch, pre_gain, note)


def record_the_rest(lesson: Any, util_rows: Sequence[dict[str, Any]], rates: dict[int, Estimate],
                    feed_gain: Estimate, w_fed: int, batch_size: int) -> list[Claim]:
    """The claims this notebook cannot check as stated: another system's numbers beside our nearest measurement,
    advice about something else (a CUDA kernel's prefetch distance), and the DataLoader's definition."""
    w8 = next((r for r in util_rows if r["num_workers"] == 8), None)
    w4 = 4 if 4 in rates else max(rates)
    cpu_proxy = w8["cpu_percent"] if w8 else max(r["cpu_percent"] or 0 for r in util_rows)
    return [
        lesson.not_comparable("cpu_usage", cpu_proxy, "that run's machine and model; ours: host CPU "
                              + ("with 8 workers, factor 2" if w8 else "at most, over the counts swept")),
        lesson.untested("prefetch_distance", "about asynchronous copies inside a CUDA kernel, not the DataLoader"),
        lesson.not_comparable("samples_160", feed_gain, f"another model and GPU, after a dozen changes at once; "
                                                        f"ours: fed / starved samples/s with {workers(w_fed)}"),
        lesson.not_comparable("batches_3_1s", rates[w4].map(lambda r: 100 * batch_size / r),
                              f"that machine's data and CPU; ours: 100 batches of {batch_size} with {workers(w4)} "
                              "(shown)"),
        lesson.untested("sixteen_workers", "the sweep stops at this host's core count"),
        lesson.check("ready_batches", 4 * 2, "DataLoader: each worker loads prefetch_factor batches ahead")]
