"""Notebook 05 (feeding the GPU): its claims as data, the functions that judge them (`check_*`, `record_the_rest`:
the only ones that record), and its figures. Loaders are in `gpulab.tools.dataloading`, fed loops in
`gpulab.tools.feeds`; the DataLoader settings are written in the notebook's cells. Nothing here times anything."""
from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any, Callable, Sequence

from ..workloads.sweeps import column, trace_estimate
from ..verdicts.claims import Claim, judge
from ..measuring.estimates import Estimate, ratio
from ..tools.dataloading import workers
from ..workloads.models import denormalize
from ..tools.feeds import knee, knee_estimate, pipeline_mfu, share_of_best, throughput_by_workers
from ..measuring.text import pct, si
from ..tools.traces import union_spans as union  # the busy time of a trace, merged

NO_GPU = "needs a CUDA GPU (here the model trains on the same CPU cores the workers use); see the reference run"
SMOKE_WHY = "smoke sizes are too small to time a data pipeline; run with SMOKE=False"
PIPE = "samples over the windows' wall time (pipeline); interval from the windows' spread"
PAIR_METHOD = "interleaved windows; 95% t-interval of the window pairs' mean log ratio"
PAIRED = f"all cores' workers / half the cores', {PAIR_METHOD}"
PAIRED_THUMB = f"the rule's workers / the best: 1 / (all cores' workers / half the cores'); {PAIR_METHOD}"
PAIRED_KNEE = "fewest workers within 5% of the best / cores; the sweep's spread, narrowed by the paired all/half ratio"
GPU = ("cuda", "full")
T54 = "guide §5.4 (its table: batch 32, pin_memory=True, 8 cores)"

# Directions with no size ("helps", "faster", "avoids") get the band "more than 1x".
CLAIMS = [
    dict(key="four_vs_zero", text="4 workers load ~5x faster than num_workers=0 (15.2 s -> 3.1 s for 100 batches on "
         "8 cores)", quote="num_workers=0: 15.2s (CPU bottleneck!)", low=4, high=6, source=T54, needs=GPU),
    dict(key="half_cores", text="the optimum is at about half the cores (4 workers on 8 cores); measured: fewest "
         "workers within 5% of the best, as a fraction of the cores", quote="num_workers=4: 3.1s (optimal)",
         low=0.4, high=0.6, unit="of the cores", source=T54, needs=GPU, timed=True),
    dict(key="past_half", text="past half the cores, more workers add little (3.1 s -> 3.0 s from 4 to 8 workers on "
         "8 cores); measured: throughput with all cores / with half", quote="num_workers=8: 3.0s (marginal gain)",
         low=0.95, high=1.05, source=T54, needs=GPU),
    dict(key="rule_of_thumb", text="rule of thumb num_workers = min(cores, 8) gets the best throughput (within 5%); "
         "measured: its throughput / the best", quote="Rule of thumb: num_workers = min(CPU cores, 8)", low=0.95,
         source="guide §5.4", needs=GPU),
    dict(key="eight_vs_four", text="8 workers instead of 4: 5-10% data loading speedup",
         quote="5-10% data loading speedup", low=5, high=10, unit="% gain", source="002 review, fix 5", needs=GPU),
    dict(key="rule_util", text="if GPU utilization is below 70% (at 4 workers), increase to 8; measured: throughput "
         "8 / 4 workers when NVML reads under 70% at 4", quote="If GPU utilization <70%, increase to 8", low=1.0,
         source="guide §5.4", needs=GPU),
    dict(key="rule_cpu", text="if host CPU use is above 90%, decrease num_workers; measured: throughput with half the "
         "workers / with the first count above 90%", quote="If CPU usage >90%, decrease num_workers", low=1.0,
         source="guide §5.4", needs=GPU),
    dict(key="sawtooth", text="a starved loop leaves the GPU idle between short bursts (the sawtooth); measured: NVML "
         "GPU busy with num_workers=0", quote="where the GPU idles between brief spikes of 100% activity", high=50,
         unit="%", source="004 article summary", needs=GPU),
    dict(key="wait_ratio", text="data loading: 45 ms -> 8 ms per iteration (5.6x); measured: data wait per batch, "
         "starved / fed", quote="Data loading: 45ms → 8ms (5.6× speedup)", low=5.2, high=6.1,
         source="003 profiling notes (arr-coc case study)", needs=GPU),
    dict(key="wait_ms", text="data loading takes 45 ms per iteration before and 8 ms after", low=8, high=45,
         quote="Data loading: 45ms → 8ms (5.6× speedup)", unit="ms", source="003 profiling notes (arr-coc case study)"),
    dict(key="prefetch_factor", text="prefetch_factor=4 helps (vs the default 2), by at least 5% (ours, as in section "
         "4); measured: throughput ratio of the fed loop", quote="Prefetch ensures batches ready.", low=1.05,
         source="002 review, fix 5", needs=GPU),
    dict(key="persistent", text="persistent_workers=True avoids the worker respawn overhead between epochs; "
         "measured: epoch-start time respawned / persistent",
         quote="`persistent_workers=True`: Avoids worker respawn overhead between epochs", low=1.0,
         source="guide §5.1"),
    dict(key="pin_copy", text="pin_memory: faster CPU->GPU transfer; measured: copy bandwidth pinned / pageable",
         quote="`pin_memory=True`: Allocates page-locked memory (faster CPU→GPU transfer)", low=1.0,
         source="guide §5.1", needs=GPU),
    dict(key="pin_loop", text="pin_memory=True makes the training loop faster; measured: loop speedup with pinned "
         "batches", quote="# Pin memory for faster GPU transfer", low=1.0, source="guide §5.1", needs=GPU),
    dict(key="prefetcher", text="the prefetcher overlaps the next batch's copy with compute, so the loop runs "
         "faster; measured: throughput ratio, prefetcher / plain loop",
         quote="# Compute with current batch while next batch loads", low=1.0, source="guide §5.3", needs=GPU),
    dict(key="cpu_usage", text="expected CPU usage 60-80% across all cores (8 workers, prefetch_factor=4)", low=60,
         high=80, quote="60-80% across cores (prevents GPU starvation)", unit="%", source="002 review"),
    dict(key="prefetch_distance", text="prefetch distance: optimal 6-8 for typical kernels", low=6, high=8,
         quote="Prefetch distance tuning: optimal 6-8 for typical kernels", unit="stages", source="000 summary",
         timed=True),
    dict(key="samples_160", text="samples/second ~160, up from ~40 (4x) after the note's changes", low=4, high=4,
         quote="~160 (up from ~40 baseline = **4x faster**)", source="002 review"),
    dict(key="batches_3_1s", text="100 batches take 3.1 s with 4 workers on 8 cores", low=3.1, high=3.1, unit="s",
         quote="num_workers=4: 3.1s (optimal)", source=T54),
    dict(key="sixteen_workers", text="16 workers on 8 cores: overhead increases (3.0 s -> 3.2 s)", high=1.0,
         quote="num_workers=16: 3.2s (overhead increases)", source=T54),
    dict(key="ready_batches", text="4 workers x prefetch_factor 2 = 8 batches ready in total", low=8, high=8,
         quote="`prefetch_factor=2`: Each worker pre-loads 2 batches (8 batches ready total)", unit="batches",
         source="guide §5.1", evidence="definition"),
]


def table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A Markdown table (cells already formatted)."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(str(c) for c in r) + " |" for r in rows])


def image_dir(lesson: Any) -> Path:
    """Where the JPEG files go: a temporary folder at smoke sizes, data/images/ (reused by later runs) at full."""
    if lesson.small:
        return Path(tempfile.gettempdir()) / "gpulab-smoke-images"
    from ..measuring.files import data_dir
    return data_dir() / "images"


def why_not(lesson: Any) -> str | None:
    """Why this run cannot test the pipeline claims (they are about feeding a GPU at real sizes), or None."""
    return None if not lesson.small else (NO_GPU if not lesson.gpu else SMOKE_WHY)


def utilization_rows(util: Sequence[tuple[int, Any]]) -> tuple[dict[int, Estimate], list[dict[str, Any]]]:
    """Per worker count: the rate over the windows' wall time with its spread, and the result JSON's row."""
    rates = {w: r.throughput_estimate() for w, r in util}
    rows = [dict(num_workers=w, samples_per_s=r.throughput, samples_per_s_interval=[rates[w].lo, rates[w].hi],
                 median_call_samples_per_s=r.items / r.seconds, nvml_util=r.metric("nvml_util"),
                 gpm_sm_active=r.metric("gpm_sm_active"), mfu=pipeline_mfu(r), cpu_percent=r.metric("cpu_percent"),
                 iqr_over_median=r.measurement.iqr / r.seconds) for w, r in util]
    return rates, rows


def worker_scaling(thr: dict[int, float], rates: dict[int, Estimate], cores: int, need: int) -> dict[str, Any]:
    """The knee (fewest workers within 5% of the best rate, with the range the spread allows), the best count, half
    the cores and the prediction: the result JSON's `worker_scaling`."""
    k_est = knee_estimate(rates, 0.95)
    return dict(knee_95=knee(thr, 0.95), knee_95_interval=[k_est.lo, k_est.hi], best=max(thr, key=thr.get),
                half_cores=max(1, cores // 2), cores=cores, predicted=need, throughput={str(w): v for w, v in thr.items()})


def settles(lesson: Any, key: str, estimate: Callable[[Any], Estimate] = lambda cmp: cmp.estimate()
            ) -> Callable[[Any], bool]:
    """For `feeds.compare_feeds(decided=...)`: whether the window pairs so far settle claim `key`, their interval
    (`estimate(cmp)`) wholly inside or wholly outside its band; more pairs are timed only where it does not."""
    spec = lesson.spec(key)
    return lambda cmp: judge(estimate(cmp).interval, spec.low, spec.high)[0] != "inconclusive"


def check_workers(lesson: Any, rates: dict[int, Estimate], *, cores: int, rule_of_thumb: int,
                  all_over_half: Estimate | None = None, four_over_zero: Estimate | None = None,
                  four_note: str = "") -> list[Claim]:
    """§5.4's worker table by its shape: 4 vs 0 workers, the knee at half the cores, little gain past it, min(cores,
    8), and 002's 8 vs 4. `all_over_half` and `four_over_zero` (interleaved windows) decide the claims on those pairs
    in place of two separately measured rates."""
    half = max(1, cores // 2)
    knee_est = paired_knee(knee_estimate(rates, 0.95), rates, all_over_half, half, cores)
    past, thumb, note = ratio(rates.get(cores), rates.get(half)), share_of_best(rates, rule_of_thumb), {}
    if all_over_half is not None and cores > half:
        past, note["past_half"], note["half_cores"] = all_over_half, PAIRED, PAIRED_KNEE
        best = max(rates, key=lambda k: rates[k].value) if rates else None
        if rule_of_thumb == half and best in (half, cores):  # the best is one of the pair: its share is paired too
            thumb, note["rule_of_thumb"] = all_over_half.map(lambda v: min(1.0, 1 / v)), PAIRED_THUMB
    four = ratio(rates.get(4), rates.get(0))
    if four_over_zero is not None:
        four, note["four_vs_zero"] = four_over_zero, four_note
    r84 = ratio(rates.get(8), rates.get(4))
    table_ = [("four_vs_zero", four, 4), ("half_cores", knee_est.map(lambda k: k / cores) if knee_est else None, 4),
              ("past_half", past, 4), ("rule_of_thumb", thumb, 1),
              ("eight_vs_four", None if r84 is None else r84.map(lambda v: (v - 1) * 100), 8)]
    out = []
    for key, value, min_cores in table_:
        if why_not(lesson):
            out.append(lesson.untested(key, why_not(lesson)))
        elif cores < min_cores or value is None:
            out.append(lesson.untested(key, f"needs at least {min_cores} cores; this host has {cores}"))
        else:
            out.append(lesson.check(key, value, note.get(key, PIPE), measurement="utilization_by_workers"))
    return out


def paired_knee(knee_est: Estimate | None, rates: dict[int, Estimate], all_over_half: Estimate | None, half: int,
                cores: int, fraction: float = 0.95) -> Estimate | None:
    """The knee's interval set by the paired all/half ratio: where half is surely within 5% of all, the knee is at
    most half; where half is surely more than 5% short, it lies above half; where the pair cannot tell, the interval
    holds both half and the next count above it, whatever the sweep's single windows read (one slow window at half
    the cores would otherwise put the knee surely above it)."""
    if knee_est is None or all_over_half is None or cores <= half:
        return knee_est
    above = min((k for k in rates if k > half), default=cores)  # the next count the sweep ran
    if all_over_half.hi < 1 / fraction:
        return Estimate(min(knee_est.value, half), min(knee_est.lo, half), min(knee_est.hi, half))
    if all_over_half.lo > 1 / fraction:
        return Estimate(max(knee_est.value, above), max(knee_est.lo, above), max(knee_est.hi, above))
    if knee_est.lo <= half and knee_est.hi >= above:
        return knee_est
    return Estimate(knee_est.value, min(knee_est.lo, half), max(knee_est.hi, above))


def check_rules(lesson: Any, util: Sequence[tuple[int, Any]], util_rows: Sequence[dict[str, Any]],
                rates: dict[int, Estimate], cores: int) -> list[Claim]:
    """§5.4's two conditional rules, each judged only where its condition holds in this run."""
    why = why_not(lesson)
    u4 = trace_estimate(dict(util).get(4), "nvml_util")
    if why or cores < 8 or u4 is None:
        util_claim = lesson.untested("rule_util", why or "needs 8 cores and NVML utilization at 4 workers")
    elif u4.hi >= 70:
        util_claim = lesson.untested("rule_util", f"the rule's condition does not hold: NVML reads "
                                                  f"{pct(u4.value, 1)} [{pct(u4.lo, 1)}, {pct(u4.hi, 1)}] at 4 workers")
    else:
        util_claim = lesson.check("rule_util", ratio(rates.get(8), rates.get(4)),
                                  f"NVML at 4 workers {pct(u4.value, 1)} [{pct(u4.lo, 1)}, {pct(u4.hi, 1)}]",
                                  measurement="utilization_by_workers")
    return [util_claim, check_rule_cpu(lesson, util_rows, rates)]


def check_rule_cpu(lesson: Any, util_rows: Sequence[dict[str, Any]], rates: dict[int, Estimate]) -> Claim:
    """"If CPU usage >90%, decrease num_workers": at the first worker count whose host CPU reads above 90%, the
    throughput of the next smaller count the sweep ran (half of it, where it ran) over its own. The note says which
    of the condition or a smaller count is missing, with the reading that decided it."""
    if why := why_not(lesson):
        return lesson.untested("rule_cpu", why)
    busy = [r for r in util_rows if r["num_workers"] > 0 and (r["cpu_percent"] or 0) > 90]
    if not busy:  # the highest reading with workers, and without (the main process's threads: none to decrease)
        top, alone = (max(((r["cpu_percent"] or 0) for r in util_rows if (r["num_workers"] > 0) == with_workers),
                          default=0) for with_workers in (True, False))
        return lesson.untested("rule_cpu", f"the rule's condition never holds with workers: host CPU at most "
                                           f"{pct(top, 1)} over the counts swept" + (
                                               f"; {pct(alone, 1)} with none, where there are none to decrease"
                                               if alone > 90 else ""))
    w90, cpu = busy[0]["num_workers"], pct(busy[0]["cpu_percent"], 1)
    fewer = [w for w in rates if 0 < w < w90]
    if not fewer or w90 not in rates:
        return lesson.untested("rule_cpu", f"the condition holds at {workers(w90)} (host CPU {cpu}), but the sweep "
                                           "ran no smaller count with workers to decrease to")
    w_less = w90 // 2 if w90 // 2 in fewer else max(fewer)
    return lesson.check("rule_cpu", ratio(rates.get(w_less), rates.get(w90)),
                        f"{workers(w90)}: host CPU {cpu}, the first count above 90%; decreased to {workers(w_less)}",
                        measurement="utilization_by_workers")


def check_sawtooth(lesson: Any, cmp_feed: Any) -> Claim:
    """The sawtooth (004): NVML's busy share of the starved loop, with the quartiles of its samples."""
    b, a = cmp_feed.before, cmp_feed.after
    why = why_not(lesson)
    if why or b.metric("nvml_util") is None:
        return lesson.untested("sawtooth", why or "NVML utilization not available on this GPU")
    bp = b.profile.busy_fraction if b.profile else None
    return lesson.check("sawtooth", trace_estimate(b, "nvml_util"), f"interval: quartiles of NVML's samples; "
                        f"profiler busy fraction {pct(bp)}; fed: {pct(a.metric('nvml_util'), 1)}")


def check_data_wait(lesson: Any, wait_b: Estimate, wait_a: Estimate, w_fed: int) -> list[Claim]:
    """The case study's 45 ms -> 8 ms (003): another project's data, model and loader, so neither its ratio nor its
    milliseconds are comparable; our data wait, starved and fed, is shown beside them."""
    why = "another system (the case study's own data, model and loader)"
    return [lesson.not_comparable("wait_ratio", ratio(wait_b, wait_a), f"{why}; ours: data wait per batch, "
                                  f"0 workers / {workers(w_fed)}", measurement="starved vs fed"),
            lesson.not_comparable("wait_ms", wait_a.map(lambda s: s * 1e3), f"{why}; ours: {si(wait_b.value, 's')} "
                                  f"starved, {si(wait_a.value, 's')} fed (shown)")]


def check_prefetch_factor(lesson: Any, pf_gain: Estimate, w_fed: int) -> Claim:
    """`prefetch_factor=4` against 2 (002), on `feeds.paired_ratio` of the interleaved windows: a 95% t-interval
    (from 7 pairs in the notebook, more only where those leave it undecided and the time allows; from three it is
    wide, and their range would hold the median only 75% of the time)."""
    why = why_not(lesson)
    return lesson.untested("prefetch_factor", why) if why else lesson.check(
        "prefetch_factor", pf_gain, f"{workers(w_fed)}; samples over the windows' wall time, 95% t-interval of the "
        "window pairs' mean log ratio; the 5% bar is ours: a bar at 1.0x cannot tell no effect from a small one")


def check_persistent(lesson: Any, starts: Any, w_fed: int) -> Claim:
    """persistent_workers (§5.1): epoch start respawned / persistent, on any machine (process start-up is CPU)."""
    resp, pers = starts.later_epochs("respawn"), starts.later_epochs("persistent")
    return lesson.check("persistent", starts.ratio_estimate(), f"{si(resp, 's')} vs {si(pers, 's')}, "
                        f"{workers(w_fed)}; interval from the epochs' quartiles")


def check_gpu_only(lesson: Any, key: str, cmp: Any, value: Any, note: str = "") -> Claim:
    """A claim measured only with CUDA (pinned memory, the prefetcher): checked on a full-size GPU run."""
    if cmp is not None and not lesson.small:
        return lesson.check(key, value, note)
    return lesson.untested(key, "needs a CUDA GPU; see the reference run" if not lesson.gpu else SMOKE_WHY)


def record_the_rest(lesson: Any, util_rows: Sequence[dict[str, Any]], rates: dict[int, Estimate],
                    feed_gain: Estimate, w_fed: int, batch_size: int, *, twice_over_all: Estimate | None = None,
                    cores: int | None = None, pf4_cpu: float | None = None, pf_workers: int | None = None
                    ) -> list[Claim]:
    """Another system's numbers beside our nearest measurement, advice about something else (a CUDA kernel's
    prefetch distance), the DataLoader's definition, and "16 workers on 8 cores" on `twice_over_all` (twice the
    cores' workers / the cores', paired) where it ran. The CPU use of "8 workers, prefetch_factor=4" is `pf4_cpu`
    (host CPU of the factor-4 side, `pf_workers` workers) where given, else the sweep's 8 workers at factor 2."""
    w8 = next((r for r in util_rows if r["num_workers"] == 8), None)
    w4 = 4 if 4 in rates else max(rates)
    cpu_proxy, cpu_how = ((pf4_cpu, f"with {workers(pf_workers)}, prefetch_factor 4") if pf4_cpu is not None else
                          (w8["cpu_percent"], "with 8 workers, factor 2") if w8 else
                          (max(r["cpu_percent"] or 0 for r in util_rows), "at most, over the counts swept"))
    why = why_not(lesson)
    twice = (lesson.untested("sixteen_workers", why or "twice the cores' workers did not run") if why or
             twice_over_all is None else
             lesson.check("sixteen_workers", twice_over_all, f"{workers(2 * cores)} on {cores} cores / {workers(cores)}"
                          "; interleaved windows, 95% t-interval of the window pairs' mean log ratio"))
    return [
        lesson.not_comparable("cpu_usage", cpu_proxy, f"that run's machine and model; ours: host CPU {cpu_how}"),
        lesson.untested("prefetch_distance", "about asynchronous copies inside a CUDA kernel, not the DataLoader"),
        lesson.not_comparable("samples_160", feed_gain, f"another model and GPU, after a dozen changes at once; "
                                                        f"ours: fed / starved samples/s with {workers(w_fed)}"),
        lesson.not_comparable("batches_3_1s", rates[w4].map(lambda r: 100 * batch_size / r),
                              f"that machine's data and CPU; ours: 100 batches of {batch_size} with {workers(w4)}"),
        twice,
        lesson.check("ready_batches", 4 * 2, "DataLoader: each worker loads prefetch_factor batches ahead")]


# ---------------------------------------------------------------- figures (they draw; they record nothing)

def samples_figure(ds: Any) -> None:
    """Four files, each loaded twice: the augmentation differs every time."""
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 8, figsize=(12, 1.9), layout="constrained")
    for i, ax in enumerate(axes):
        x, y = ds[i % 4]
        ax.imshow(denormalize(x).numpy())
        ax.set_title(f"file {i % 4}, class {y}", fontsize=8)
        ax.axis("off")
    fig.suptitle("what the model sees: random crop, flip and colour jitter on every load", fontsize=10)
    plt.show()


def sweep_figure(sweep: Any, worker_list: Sequence[int], pins: Sequence[bool], pred: dict[str, Any], batch_size: int,
                 gpu: bool, ref: dict[str, Any] | None) -> None:
    """Throughput per worker count for each pin_memory (pageable red, pinned teal, as in the later figures), the
    step-alone ceiling, the prediction min(k·B/L, B/S) and the reference GPU's same sweep, dashed."""
    import matplotlib.pyplot as plt

    from ..display import plots
    load_s, step_s = pred["load_s_per_batch"], pred["step_s_per_batch"]
    ref_rows = (((ref or {}).get("extra", {}).get("dataloader_sweep")) or {}).get("rows")
    lines = {f"pin_memory={p}": [throughput_by_workers(sweep.rows, pin_memory=p).get(w) for w in worker_list]
             for p in pins}
    fig = plots.sweep(worker_list, lines, xlabel="num_workers", ylabel="samples/s",
                      title=f"DataLoader throughput vs workers ({pred['cores']} cores, batch {batch_size})",
                      hlines={f"{'GPU' if gpu else 'CPU'} step alone (B/S)": batch_size / step_s})
    ax, colour = fig.axes[0], {False: plots.BEFORE, True: plots.AFTER}
    for line in ax.get_lines():
        for p in pins:
            if line.get_label() == f"pin_memory={p}":
                line.set_color(colour[bool(p)])
    for p in pins if ref_rows else ():  # the same short sweep on the reference GPU, not its longer windows
        thr = throughput_by_workers(ref_rows, pin_memory=p)
        if thr:
            ax.plot(list(thr), list(thr.values()), ls="--", marker=".", alpha=0.6, color=colour[bool(p)],
                    label=f"pin_memory={p} (reference GPU)")
    predicted = [batch_size / max(load_s / max(w, 1), step_s) for w in worker_list]
    ax.plot(worker_list, predicted, ls="--", color="k", lw=1, label="prediction min(k·B/L, B/S)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    plt.show()


def utilization_figure(rows: Sequence[dict[str, Any]], worker_list: Sequence[int], gpu: bool) -> None:
    """NVML busy, GPM SM activity and host CPU per worker count."""
    import matplotlib.pyplot as plt

    from ..display import plots
    fig = plots.sweep(worker_list, {"GPU busy, NVML (%)": column(rows, "nvml_util"),
                                    "SM active, GPM (%)": column(rows, "gpm_sm_active"),
                                    "host CPU, all cores (%)": column(rows, "cpu_percent")},
                      xlabel="num_workers", ylabel="percent", title="utilization vs DataLoader workers")
    if not gpu:
        fig.axes[0].text(0.5, 0.5, "GPU utilization: not available (no CUDA GPU)", transform=fig.axes[0].transAxes,
                         ha="center", color="#666")
    fig.tight_layout()
    plt.show()


def busy_idle_figure(spans: dict[str, Sequence[tuple[float, float]]], what: str, batches: int) -> None:
    """One row per loop: its busy intervals (`what`, from a profiler trace) as bars over time, the gaps between
    them idle; each row's busy share of its own span in the label."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 0.9 + 0.9 * len(spans)))
    colors = ("#d62728", "#2ca02c", "#1f77b4")
    for i, (label, raw) in enumerate(spans.items()):
        busy = union(raw)
        if not busy:
            ax.text(0, i, f"{label}: no busy intervals in the trace", va="center", fontsize=9)
            continue
        start, end = busy[0][0], busy[-1][1]
        share = sum(hi - lo for lo, hi in busy) / (end - start) if end > start else 1.0
        ax.broken_barh([(lo - start, hi - lo) for lo, hi in busy], (i - 0.35, 0.7), color=colors[i % 3])
        ax.text(end - start, i + 0.42, f"busy {share:.0%} of {end - start:.3g} s", ha="right", va="bottom", fontsize=8)
    ax.set_yticks(range(len(spans)), list(spans))
    ax.set_ylim(-0.6, len(spans) - 0.1)
    ax.invert_yaxis()
    ax.set(xlabel="seconds from the first busy interval",
           title=f"{what} busy (bars) and idle (gaps) over {batches} batches, from a profiler trace")
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    plt.show()


def epoch_figure(starts: Any, w_fed: int) -> None:
    """Bars: time to an epoch's first batch with respawned and with persistent workers (epochs 2+)."""
    import matplotlib.pyplot as plt

    from ..display import plots
    resp, pers = starts.later_epochs("respawn"), starts.later_epochs("persistent")
    plots.bars(["persistent_workers=False", "persistent_workers=True"], [resp * 1e3, pers * 1e3],
               ylabel="ms until the first batch", fmt="{:.3g} ms",
               title=f"epoch start with {workers(w_fed)} (median of epochs 2+)")
    plt.gcf().tight_layout()
    plt.show()

