"""Notebook 05's scaffolding: its smoke sizes, and the tables, figures and sentences that report what it measured
(the prediction L/S, the DataLoader sweep, utilization per worker count, the sawtooth, the data wait, the epoch
start, pinned memory and the prefetcher). The claims and their verdicts live in `gpulab.lessons.data_claims` and
are re-exported here, so the notebook needs one handle.

The measuring stays in the notebook (the DataLoader settings, the fed loops it times) and in
`gpulab.lessons.data_lab`; nothing here times anything.
"""
from __future__ import annotations

import os
import statistics
import tempfile
from pathlib import Path
from typing import Any, Sequence

from ..claims import Estimate
from ..timing import fmt_time
from .data_claims import (CLAIMS, pct, check_data_wait, check_persistent, check_pinned, check_prefetch_factor,
                          check_prefetcher, check_rules, check_sawtooth, check_workers, record_the_rest, why_not,
                          workers)
from .data_lab import (column, denormalize, knee, knee_estimate, pipeline_mfu, throughput_by_workers,
                       worker_counts)
from .measuring_lesson import source

__all__ = ["SMOKE_SIZES", "CLAIMS", "source", "use_sizes", "image_dir", "setup_note", "dataset_note",
           "samples_figure", "prediction_report", "sweep_figure", "sweep_report", "utilization_rows",
           "utilization_table", "utilization_figure", "worker_scaling", "scaling_report", "sawtooth_figure",
           "sawtooth_report", "data_waits", "data_wait_report", "epoch_figure", "epoch_report", "pinned_report",
           "headroom_report", "prefetcher_report", "reference_note", "workers", "why_not", "check_workers",
           "check_rules", "check_sawtooth", "check_data_wait", "check_prefetch_factor", "check_persistent",
           "check_pinned", "check_prefetcher", "record_the_rest"]

# Smoke sizes (SMOKE=True, or no CUDA GPU): without a GPU the CNN trains on the CPU, and full sizes would take
# many minutes. A reader's WORKERS and MIN_TIME_S are kept.
SMOKE_SIZES = dict(N_IMAGES=48, IMAGE_SIZE=32, BATCH_SIZE=8, CNN_WIDTH=8, SWEEP_BATCHES=3, BATCHES_PER_CALL=2,
                   PREFETCH_BATCH=16)
SMOKE_WORKERS = [0, 1, 2]
SMOKE_MIN_TIME_S = 0.05
# Recorded lower-case in the result JSON (the reference runs' keys), with the cores.
PARAMS = ("N_IMAGES", "IMAGE_SIZE", "BATCH_SIZE", "CNN_WIDTH", "WORKERS", "SWEEP_BATCHES", "BATCHES_PER_CALL",
          "PREFETCH_BATCH", "MIN_TIME_S")


def use_sizes(lesson: Any, ns: dict[str, Any], cores: int, rule_of_thumb: int) -> dict[str, Any]:
    """At smoke scale put the smoke sizes into the notebook's namespace; choose the worker counts (0, 1, 2, 4, ...,
    half the cores, all of them, and the rule of thumb); record the sizes used either way."""
    lesson.use_smoke_sizes(ns, SMOKE_SIZES | {"WORKERS": ns.get("WORKERS") or list(SMOKE_WORKERS)},
                           min_time_s=SMOKE_MIN_TIME_S)
    ns["WORKERS"] = sorted(set(ns.get("WORKERS") or worker_counts(cores, extra=[rule_of_thumb])))
    return lesson.record_sizes(ns, PARAMS, lower=True, extra={"cores": cores})


def image_dir(lesson: Any) -> Path:
    """Where the JPEG files go: a temporary folder at smoke sizes, data/images/ (reused by later runs) at full."""
    if lesson.small:
        return Path(tempfile.gettempdir()) / "gpulab-smoke-images"
    from ..results import data_dir
    return data_dir() / "images"


def setup_note(lesson: Any, cores: int, worker_list: Sequence[int]) -> str:
    """The cores this process may use, the worker counts swept, and what a run without a GPU leaves out."""
    note = (f"This process may use **{cores} CPU cores** (the guide's table in §5.4 was measured on 8). "
            f"Worker counts swept: {list(worker_list)}.")
    if not lesson.gpu:
        note += ("\n\n**No CUDA GPU here.** The CNN trains on the CPU, so the model and the DataLoader workers "
                 "compete for the same cores, and the run uses smoke sizes whatever `SMOKE` says. GPU utilization, "
                 "pinned memory and the side-stream prefetcher are skipped (each section says so), the GPU claims "
                 "are marked *not tested*, and the reference GPU's results are shown at the end.")
    return note


def dataset_note(ds: Any, folder: Path, image_size: int, ready_s: float) -> str:
    """How many JPEG files, how big, where, and how long they took to be ready."""
    kb = statistics.fmean(os.path.getsize(p) for p in ds.paths[:200]) / 1e3
    return (f"{len(ds)} JPEG files of {image_size}×{image_size} px in `{folder}`, {kb:.1f} kB each on average, "
            f"ready in {ready_s:.1f} s.")


def samples_figure(ds: Any) -> None:
    """Four files, each loaded twice: the augmentation differs every time."""
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 8, figsize=(12, 1.9))
    for i, ax in enumerate(axes):
        x, y = ds[i % 4]
        ax.imshow(denormalize(x).numpy())
        ax.set_title(f"file {i % 4}, class {y}", fontsize=8)
        ax.axis("off")
    fig.suptitle("what the model sees: random crop, flip and colour jitter on every load", fontsize=10)
    plt.show()


def prediction_report(pred: dict[str, Any], step_iqr: float, batch_size: int, gpu: bool) -> str:
    """The table of L and S, the step's MFU, and the prediction L/S workers."""
    load_s, step_s, need, cores = (pred["load_s_per_batch"], pred["step_s_per_batch"], pred["workers_to_feed"],
                                   pred["cores"])
    unit, mfu = ("GPU" if gpu else "CPU"), pred["step_mfu"]
    s_time = f"{fmt_time(step_s)} ± {fmt_time(step_iqr)}"
    return f"""
| per batch of {batch_size} images | time | samples/s |
|---|---|---|
| **L**: load in one process (decode, augment, collate) | {fmt_time(load_s)} | {batch_size / load_s:,.0f} |
| **S**: train step on the {unit} ({pred['dtype']}), data already there | {s_time} | {batch_size / step_s:,.0f} |

The CNN does {pred['flops_per_sample'] / 1e9:.2f} GFLOP of training work per image; the step alone reaches an MFU of
{'n/a (no datasheet peak for this device)' if mfu is None else f'{mfu:.1%}'}, the ceiling for every loop below.

**Prediction:** L/S = {load_s / step_s:.1f}, so about **{workers(need)}** keep the {unit} fed
({'within' if need <= cores else 'more than'} the {cores} cores this process may use).
"""


def sweep_figure(sweep: Any, worker_list: Sequence[int], pins: Sequence[bool], pred: dict[str, Any], batch_size: int,
                 gpu: bool, ref: dict[str, Any] | None) -> None:
    """Throughput per worker count for each pin_memory, the step-alone ceiling, the prediction min(k·B/L, B/S) and
    the reference GPU's steady-state rates."""
    import matplotlib.pyplot as plt

    from ..display import plots
    load_s, step_s, cores = pred["load_s_per_batch"], pred["step_s_per_batch"], pred["cores"]
    ref_lines = {}
    if ref and ref.get("extra", {}).get("utilization_by_workers"):
        rows = ref["extra"]["utilization_by_workers"]
        ref_lines["samples/s"] = ([r["num_workers"] for r in rows], [r["samples_per_s"] for r in rows])
    lines = {f"pin_memory={p}": [throughput_by_workers(sweep.rows, pin_memory=p).get(w) for w in worker_list]
             for p in pins}
    fig = plots.sweep(worker_list, lines, xlabel="num_workers", ylabel="samples/s",
                      title=f"DataLoader throughput vs workers ({cores} cores, batch {batch_size})",
                      hlines={f"{'GPU' if gpu else 'CPU'} step alone (B/S)": batch_size / step_s}, ref=ref_lines)
    # each worker adds one process's loading rate until the step becomes the limit
    predicted = [batch_size / max(load_s / max(w, 1), step_s) for w in worker_list]
    fig.axes[0].plot(worker_list, predicted, ls="--", color="k", lw=1, label="prediction")
    fig.axes[0].legend(fontsize=8)
    plt.show()


def sweep_report(sweep: Any, pred: dict[str, Any], batch_size: int, gpu: bool) -> str:
    """The fastest setting, against num_workers=0 and against the step alone."""
    b0 = max(r["samples_per_s"] for r in sweep.rows if r["num_workers"] == 0)
    best, cores, step_s = sweep.best, pred["cores"], pred["step_s_per_batch"]
    return (f"Fastest setting: **num_workers={best['num_workers']}, pin_memory={best['pin_memory']}** at "
            f"{best['samples_per_s']:,.0f} samples/s"
            + (f", {best['samples_per_s'] / b0:.1f}x the {b0:,.0f} samples/s of `num_workers=0`"
               if best["num_workers"] else " (no worker setting beat loading in the main process here)")
            + f", with the host's CPU {best['cpu_percent']:.0f}% busy (mean over its {cores} cores). "
            f"The {'GPU' if gpu else 'CPU'} step alone could take {batch_size / step_s:,.0f} samples/s.")


def utilization_rows(util: Sequence[tuple[int, Any]]) -> tuple[dict[int, Estimate], list[dict[str, Any]]]:
    """Per worker count: the rate over the windows' wall time with its spread, and the row the result JSON keeps
    (`utilization_by_workers`)."""
    rates = {w: r.throughput_estimate() for w, r in util}
    rows = [dict(num_workers=w, samples_per_s=r.throughput, samples_per_s_interval=[rates[w].lo, rates[w].hi],
                 median_call_samples_per_s=r.items / r.seconds, nvml_util=r.metric("nvml_util"),
                 gpm_sm_active=r.metric("gpm_sm_active"), mfu=pipeline_mfu(r), cpu_percent=r.metric("cpu_percent"),
                 iqr_over_median=r.measurement.iqr / r.seconds) for w, r in util]
    return rates, rows


def _mfu(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.2%}"


def utilization_table(rows: Sequence[dict[str, Any]]) -> str:
    """The utilization rows as a Markdown table."""
    table = ("| num_workers | samples/s (window) | [interval] | items / median call | GPU busy (NVML) "
             "| SM active (GPM) | MFU | host CPU |\n|---|---|---|---|---|---|---|---|\n")
    return table + "".join(
        f"| {r['num_workers']} | {r['samples_per_s']:,.0f} | [{r['samples_per_s_interval'][0]:,.0f}, "
        f"{r['samples_per_s_interval'][1]:,.0f}] | {r['median_call_samples_per_s']:,.0f} | {pct(r['nvml_util'])} "
        f"| {pct(r['gpm_sm_active'])} | {_mfu(r['mfu'])} | {pct(r['cpu_percent'])} |\n" for r in rows)


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
    plt.show()


def worker_scaling(thr: dict[int, float], rates: dict[int, Estimate], cores: int, need: int) -> dict[str, Any]:
    """The knee (fewest workers within 5% of the best steady-state throughput, with the range the windows' spread
    allows), the best count and half the cores: the result JSON's `worker_scaling`."""
    k = knee(thr, 0.95)
    k_est = knee_estimate(rates, 0.95)
    return dict(knee_95=k, knee_95_interval=[k_est.lo, k_est.hi], best=max(thr, key=thr.get),
                half_cores=max(1, cores // 2), cores=cores, predicted=need,
                throughput={str(w): v for w, v in thr.items()})


def scaling_report(scaling: dict[str, Any], thr: dict[int, float], rows: Sequence[dict[str, Any]], load_s: float,
                   batch_size: int) -> str:
    """Where the steady-state curve flattens, against the prediction and the cores; and what the median call
    would have read for the burstiest worker count."""
    k, (lo, hi), best, cores, need = (scaling["knee_95"], scaling["knee_95_interval"], scaling["best"],
                                      scaling["cores"], scaling["predicted"])
    burst = max(rows, key=lambda r: r["median_call_samples_per_s"] / r["samples_per_s"])
    return (f"Steady state: the best is **{workers(best)}** ({thr[best]:,.0f} samples/s); **{workers(k)}** already "
            f"reach{'es' if k == 1 else ''} 95% of it (between {lo:g} and {hi:g} within the windows' spread), "
            f"which is {k / cores:.0%} of this host's {cores} cores. The prediction from L/S was {need}, and L/S also "
            f"caps what k workers can load: {batch_size / load_s:,.0f} samples/s per worker. Where the curve flattens "
            f"depends on how much CPU work a sample costs against how much GPU work it gives, not on the core count "
            f"as such: the cores only cap it. Items over the median call would have read "
            f"{burst['median_call_samples_per_s']:,.0f} samples/s for {workers(burst['num_workers'])}, against "
            f"{burst['samples_per_s']:,.0f} over the windows.")


def sawtooth_figure(cmp_feed: Any, gpu: bool, w_fed: int) -> None:
    """The utilization timeline of the starved and the fed loop (GPU panels first on a GPU)."""
    import matplotlib.pyplot as plt

    from ..display import plots
    panels = ("nvml_util", "gpm_sm_active", "cpu_percent") if gpu else ("cpu_percent", "nvml_util")
    plots.timeline(cmp_feed, metrics=panels,
                   title=f"the sawtooth: 0 workers vs {workers(w_fed)} (utilization over time)")
    plt.show()


def sawtooth_report(cmp_feed: Any, feed_gain: Estimate, w_fed: int, gpu: bool) -> str:
    """Fed against starved: throughput, GPU busy by NVML and by the profiler trace, host CPU."""
    b, a = cmp_feed.before, cmp_feed.after
    bp, ap = (b.profile.busy_fraction if b.profile else None), (a.profile.busy_fraction if a.profile else None)
    return (f"Fed by {workers(w_fed)} instead of none, the loop trains **{feed_gain.value:.2f}x** the samples per "
            f"second [{feed_gain.lo:.2f}, {feed_gain.hi:.2f}] (over the windows' wall time). "
            + (f"GPU busy by NVML: {pct(b.metric('nvml_util'))} starved, {pct(a.metric('nvml_util'))} fed; by the "
               f"profiler trace: {pct(bp, 100)} starved, {pct(ap, 100)} fed. " if gpu else
               "No GPU here, so there is no GPU utilization to plot; the host CPU panel still shows the workers' "
               "load. ")
            + f"Host CPU: {pct(b.metric('cpu_percent'))} starved, {pct(a.metric('cpu_percent'))} fed.")


def data_waits(wait_b: Estimate, wait_a: Estimate, w_fed: int) -> dict[str, Any]:
    """The data wait per batch in ms (median, low, high) starved and fed: the result JSON's `data_wait_ms_per_batch`."""
    return dict(starved=[wait_b.value * 1e3, wait_b.lo * 1e3, wait_b.hi * 1e3],
                fed=[wait_a.value * 1e3, wait_a.lo * 1e3, wait_a.hi * 1e3], workers=w_fed)


def data_wait_report(wait_b: Estimate, wait_a: Estimate, w_fed: int, batch_size: int) -> str:
    """One sentence: the wait per batch with 0 workers and with the fed count."""
    return (f"Waiting for data per batch of {batch_size}: **{fmt_time(wait_b.value)}** with 0 workers, "
            f"**{fmt_time(wait_a.value)}** with {workers(w_fed)} ({wait_b.value / wait_a.value:.1f}x less).")


def epoch_figure(starts: Any, w_fed: int) -> None:
    """Bars: time to an epoch's first batch with respawned and with persistent workers (epochs 2+)."""
    import matplotlib.pyplot as plt

    from ..display import plots
    resp, pers = starts.later_epochs("respawn"), starts.later_epochs("persistent")
    plots.bars(["respawned workers\n(persistent_workers=False)", "persistent workers\n(persistent_workers=True)"],
               [resp * 1e3, pers * 1e3], ylabel="ms until the first batch", fmt="{:.1f} ms",
               title=f"epoch start with {workers(w_fed)} (median of epochs 2+)")
    plt.show()


def epoch_report(starts: Any, n_images: int, batch_size: int, fed_rate: float) -> str:
    """The epoch start each way, and the saving as a share of a full pass at the fed rate."""
    import torch
    resp, pers = starts.later_epochs("respawn"), starts.later_epochs("persistent")
    epoch_s = (n_images // batch_size) * batch_size / fed_rate
    return (f"Each epoch start costs **{resp * 1e3:.0f} ms** with respawned workers and **{pers * 1e3:.0f} ms** with "
            f"persistent ones ({starts.ratio:.1f}x). Against a full pass over these {n_images} images "
            f"(about {epoch_s:.1f} s at the fed rate) the saving is {(resp - pers) / epoch_s:.1%} of an epoch: "
            f"large for short epochs and for *spawn* start-up (a fresh interpreter per worker), small for long epochs "
            f"with *fork* (this run uses `{torch.multiprocessing.get_start_method()}`).")


def pinned_report(cmp_copy: Any, cmp_pin_loop: Any, gb: float | None, step_s: float) -> str:
    """The copy's bandwidth each way and its share of a step; or why the section was skipped."""
    if cmp_copy is None:
        return ("Skipped: pinned memory and asynchronous copies need a CUDA GPU (`tensor.pin_memory()` raises "
                "without one). The reference run below has these numbers.")
    copy_s = cmp_copy.after.seconds
    return (f"One batch is {gb * 1e3:.1f} MB: {cmp_copy.before.throughput:.1f} GB/s from pageable memory, "
            f"{cmp_copy.after.throughput:.1f} GB/s from pinned memory ({cmp_copy.verdict}). The pinned copy takes "
            f"{fmt_time(copy_s)}, **{copy_s / step_s:.1%} of a training step** ({fmt_time(step_s)}): that share is "
            f"all the loop can gain from a faster copy. In the loop: {cmp_pin_loop.verdict}.")


def headroom_report(headroom: dict[int, dict[str, float]]) -> str:
    """Host launch time against GPU time per step at each batch size measured; or why there is none."""
    if not headroom:
        return "Skipped: launching and running are the same work on a CPU; the reference run below has it."
    rows = "".join(f"| {b} | {fmt_time(h['host_s'])} | {fmt_time(h['gpu_s'])} | {h['gpu_s'] / h['host_s']:.1f}x |\n"
                   for b, h in sorted(headroom.items()))
    small, large = min(headroom), max(headroom)
    return ("| batch | host: launch one step | GPU: one step | headroom |\n|---|---|---|---|\n" + rows +
            f"\nAt batch {small} the GPU has {headroom[small]['gpu_s'] / headroom[small]['host_s']:.1f}x the host's "
            "time per step: the smaller that margin, the more any extra host work (the prefetcher's own, or a busy "
            f"neighbour's) stalls the GPU instead of hiding a copy. The comparison below uses batch {large}, where "
            "the host's work per step is the same and the GPU's grows with the batch, so it measures the overlap "
            "the guide describes rather than this host's speed.")


def prefetcher_report(pre_gain: Estimate | None, copy_share: float | None) -> str:
    """The prefetcher's gain beside the copy's share of a step; or why the section was skipped."""
    if pre_gain is None:
        return ("Skipped: the prefetcher overlaps a copy with compute on two CUDA streams; without a GPU it "
                "is plain iteration. The reference run below has this experiment.")
    return (f"The prefetcher: **{pre_gain.value:.3f}x** the samples per second [{pre_gain.lo:.3f}, {pre_gain.hi:.3f}]; "
            f"the copy it can hide is {copy_share:.1%} of a step. It pays off when batches are large and the model "
            "is quick (the copy is a big share of the step), and it cannot hide decoding: with a starved loader it "
            "waits like the plain loop.")


def reference_note(ref: dict[str, Any] | None) -> str:
    """The heading of the comparison with the reference run, or why there is none."""
    if ref is None:
        return "No reference GPU run is committed for this notebook yet, so there is nothing to compare with."
    return f"### This run beside the reference run ({ref['device']['name']})"
