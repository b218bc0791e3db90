"""Notebook 01 (measuring): its claims as data, the evidence each one is judged on, and its tables and figures."""
from __future__ import annotations

from typing import Any, Sequence

from ..measuring.estimates import Estimate, difference
from ..measuring.text import pct, ratio, si, sig
from ..workloads.sampling import captured_by_pattern, gpm_estimate, samples_estimate

_S11, _TABLE = "guide §1.1", "guide §1.2 (Typical MFU Values)"
_SUMMARY = "000 summary"
CLAIMS = [
    dict(key="kernels_active", text="GPU Utilization: percentage of time GPU had active kernels (NVML ÷ the busy "
         "share from CUDA events, bursts)", quote="GPU Utilization: Percentage of time GPU had active kernels "
         "(0-100%)", low=0.8, high=1.25, unit="x", source=_S11, needs=("cuda",)),
    dict(key="memory_util", text="Memory Utilization: percentage of memory bandwidth used (NVML memory util minus "
         "GPM DRAM bandwidth, a copy, a random gather and a matmul)",
         quote="Memory Utilization: Percentage of memory bandwidth used",
         low=-10, high=10, unit="points", source=_S11, needs=("cuda",)),
    dict(key="window", text="nvidia-smi utilization averages over 1-second windows",
         quote="Averages over 1-second windows", low=0.9, high=1.1, unit="s", source=_S11, needs=("cuda",)),
    dict(key="bursts", text="Sampling-based: misses short bursts (share of the bursts' busy time NVML reports)",
         quote="Sampling-based (misses short bursts)", high=0.5, unit="x", source=_S11, needs=("cuda",)),
    dict(key="compute_types", text="Doesn't distinguish compute types: FP32 vs tensor-core matmul, NVML busy "
         "difference (points)", quote="Doesn't distinguish compute types (FP32 vs Tensor Core)", low=-10, high=10,
         unit="points", source=_S11, needs=("cuda",)),
    dict(key="target_util", text="Target: 90%+ GPU utilization (the optimised training loop)", low=90, unit="%",
         quote="Target: 90%+ GPU utilization", source=_S11, needs=("cuda",)),
    dict(key="target_mem", text="Target: 70%+ memory utilization (the optimised training loop)", low=70, unit="%",
         quote="70%+ memory utilization", source=_S11, needs=("cuda",)),
    dict(key="raw_matmul", text="Raw matmuls: 70-80% MFU achievable", quote="Raw matmuls: 70-80% MFU achievable",
         low=70, unit="%", source=_SUMMARY, needs=("cuda",)),
    dict(key="good_training", text="40-60% MFU: good transformer training (the course's optimised loop)", low=40,
         high=60, unit="%", quote="40-60%: Good transformer training (communication overhead normal)",
         source=_TABLE, needs=("cuda", "full")),
    dict(key="no_sync", text="Timing without synchronize measures the launch, not the work (events / no-sync host "
         "clock)", quote="torch.cuda.synchronize()", low=2, unit="x",
         source="guide §1.2 (MFUTracker syncs before reading the clock)", needs=("cuda",)),
    dict(key="gpt2_formula", text="GPT-2 small, batch 32 × 1024: ~1.7 TFLOPs per step (by the guide's own formula)",
         quote="Result: ~1.7e12 FLOPs per step (1.7 TFLOPs)", low=1.5, high=1.9, unit="TFLOP", source="guide §1.2",
         evidence="arithmetic"),
    dict(key="gpt2_counted", text="GPT-2 small, batch 32 × 1024: ~1.7 TFLOPs per training step (FlopCounterMode)",
         quote="Actual FLOPs/s = 1.7e12 / 0.5 = 3.4 TFLOPs/s", low=1.5, high=1.9, unit="TFLOP",
         source="guide §1.2", evidence="arithmetic"),
    dict(key="mfu_example", text="1.7e12 FLOPs in 0.5 s on a 312 TFLOP/s A100 is 1.09% MFU", low=1.085, high=1.095,
         quote="MFU = 3.4 / 312 = 1.09% (very low! needs optimization)", unit="%", source="guide §1.2",
         evidence="arithmetic"),
    # Other systems' MFU: our optimised loop stands beside them as a proxy.
    dict(key="llama", text="Llama 3 405B: 38-41% MFU", quote="Meta LLaMA 3 405B: 38-41% MFU (state-of-the-art)",
         low=38, high=41, unit="%", source=_SUMMARY),
    # DeepSeek-v3's "20-30% MFU (communication bottleneck)" and "50-60% MFU is excellent for transformers
    # (communication overhead)" are about multi-GPU training: notebook 10 judges them beside its DDP MFU.
    # Labels for ranges, and claims about tools or fleets this course does not measure.
    dict(key="range_1_5", text="1-5% MFU: severe bottleneck (data loading, small batch, CPU sync)", low=1, high=5,
         quote="1-5%: Severe bottleneck (data loading, small batch, CPU sync)", unit="%", source=_TABLE),
    dict(key="range_10_30", text="10-30% MFU: poor optimization (missing mixed precision, inefficient kernels)",
         quote="10-30%: Poor optimization (missing mixed precision, inefficient kernels)", low=10, high=30, unit="%",
         source=_TABLE),
    dict(key="range_60_80", text="60-80% MFU: excellent for CNNs or single-GPU training", low=60, high=80, unit="%",
         quote="60-80%: Excellent for CNNs or single-GPU training", source=_TABLE),
    dict(key="range_80", text="80%+ MFU: exceptional (rare, requires perfect conditions)", low=80, unit="%",
         quote="80%+: Exceptional (rare, requires perfect conditions)", source=_TABLE),
    dict(key="serverless", text="90%+ GPU allocation utilization achievable with serverless", low=90, unit="%",
         quote="90%+ GPU Allocation Utilization achievable with serverless", source=_SUMMARY),
    dict(key="dcgm", text="DCGM: dcgmi dmon -e 1004 reads tensor-core activity (DCGM_FI_PROF_PIPE_TENSOR_ACTIVE)",
         quote="dcgmi dmon -e 1004  # DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", low=0, high=100, unit="%",
         source="guide §1.3"),
]
NOT_COMPARABLE = {"llama": "thousands of GPUs, another model"}
_RANGE = ("a label for a range of MFU, not a prediction about a workload; notebook 08's waterfall shows loops across "
          "these ranges")
UNTESTABLE = {"range_1_5": _RANGE, "range_10_30": _RANGE, "range_60_80": _RANGE, "range_80": _RANGE,
              "serverless": "a fleet-scheduling figure: one GPU in one process cannot measure allocation across users",
              "dcgm": "the DCGM tools are not part of this course; the same counters are read above through NVML's "
                      "GPM interface"}

Evidence = tuple[Any, str]  # (an Estimate, Comparison or number; or None) and the note, or the reason it is None
_NVML = "needs a CUDA GPU with NVML"


def tiny_count(big_n: int, tiny_size: int) -> int:
    """How many tiny_size³ matmuls do the FLOPs of one big_n³ matmul ((big_n / tiny_size)³)."""
    if big_n % tiny_size:
        raise ValueError(f"BIG_N={big_n} must be a multiple of TINY_SIZE={tiny_size} (equal FLOPs on both sides)")
    return (big_n // tiny_size) ** 3


def mfu_estimate(run: Any, peak_tflops: float | None) -> Estimate | None:
    """MFU in % of `peak_tflops` of a RunResult, the interval from its timings' quartiles; None without a peak."""
    if not peak_tflops or not getattr(run, "flops", None):
        return None
    return run.measurement.estimate().map(lambda t: 100 * run.flops / t / 1e12 / peak_tflops)


# ---------------------------------------------------------------- the evidence for each claim


def kernels_active(captured: Estimate | None, runs: Sequence[Any]) -> Evidence:
    """NVML's reading over the share of time a kernel really ran (CUDA events), on bursts with idle gaps.

    A definition must hold on every burst pattern: the value is the ratio pooled over all of them, the interval
    spans every pattern's own (`sampling.captured_by_pattern`), so the claim is confirmed only if each pattern's
    ratio lies in the band (pooled quartiles put the verdict at the mercy of the short bursts' cluster)."""
    each = [(b, e) for b, e in zip(runs, captured_by_pattern(runs)) if e is not None]
    if captured is None or not each:
        return None, "needs a CUDA GPU with NVML utilization samples (the burst test)"
    est = Estimate(captured.value, min([e.lo for _, e in each] + [captured.value]),
                   max([e.hi for _, e in each] + [captured.value]))
    return est, ("bursts with idle gaps: " + "; ".join(
        f"{b.burst_ms:g} ms every {b.burst_ms + b.gap_ms:g} ms: GPU busy {pct(b.true_busy_pct, 1)}, NVML "
        f"{pct(b.nvml_pct, 1)}, NVML/busy {ratio(e.value)} [{sig(e.lo)}, {sig(e.hi)}]" for b, e in each)
        + "; value: pooled over the patterns, interval: every pattern's (95% for the median of its periods); "
        "the ±25% band is ours")


def memory_util(watches: dict[str, Any]) -> Evidence:
    """utilization.memory minus GPM's DRAM bandwidth on a copy, a random gather and a compute-bound matmul.

    The claim must hold on each: the workload whose difference lies furthest from zero is the one judged."""
    diffs = {}
    for name, w in watches.items():
        mem, dram = samples_estimate(w, "nvml_mem_util"), gpm_estimate(w, "gpm_dram_bw")
        if mem is None or dram is None:
            return None, "needs NVML and GPM (a Hopper or newer GPU) to compare with the bandwidth actually used"
        diffs[name] = (difference(mem, dram), mem, dram)
    worst = max(diffs, key=lambda k: abs(diffs[k][0].value))
    return diffs[worst][0], "; ".join(f"{k}: utilization.memory {pct(m.value, 1)}, DRAM bandwidth {pct(d.value, 1)} "
                                      "(GPM)" for k, (_, m, d) in diffs.items()) + f"; judged on the {worst}"


def window(period: Estimate | None) -> Evidence:
    """The spacing of NVML's buffered samples."""
    if period is None:
        return None, "needs a CUDA GPU with NVML utilization samples"
    return period, "spacing of NVML's buffered utilization samples during our runs (median, quartiles)"


def bursts(captured: Estimate | None, runs: Sequence[Any]) -> Evidence:
    """The share of the bursts' busy time NVML reported ("misses" read as: at most half of it shows up)."""
    if captured is None:
        return None, "needs a CUDA GPU with NVML utilization samples (the burst test)"
    return captured, ("; ".join(f"{b.burst_ms:g} ms bursts every {b.burst_ms + b.gap_ms:g} ms: {b.missed_periods} "
                                f"of {len(b.periods)} periods read 0%" for b in runs)
                      + "; tested: gaps under one sample period, not an isolated burst")


def compute_types(watch_fp32: Any, watch_big: Any, dtype: str) -> Evidence:
    """NVML busy of the tensor-core matmul minus that of the FP32 one, each 2 s back to back."""
    a, b = samples_estimate(watch_big, "nvml_util"), samples_estimate(watch_fp32, "nvml_util")
    if a is None or b is None:
        return None, _NVML
    return difference(a, b), (f"2 s back to back each: NVML FP32 {pct(b.value, 1)} vs {dtype.upper()} "
                              f"{pct(a.value, 1)}; GPM tensor active {pct(watch_fp32.mean('gpm_tensor_active'), 1)} "
                              f"vs {pct(watch_big.mean('gpm_tensor_active'), 1)}")


def target_util(opt_nvml: Estimate | None, run_graph: Any) -> Evidence:
    """A target, read as "a well-optimised training loop keeps NVML at 90%+", tested on ours."""
    if opt_nvml is None:
        return None, _NVML
    return opt_nvml, (f"NVML samples over the optimised loop's timed steps; the CUDA graph of tiny matmuls read "
                      f"{pct(run_graph.metric('nvml_util'), 1)} busy at {pct(run_graph.mfu)} MFU: reaching the "
                      "target says nothing about useful work")


def target_mem(opt_trace: Any, run_big: Any) -> Evidence:
    """utilization.memory over the optimised loop's timed steps."""
    mem = samples_estimate(opt_trace, "nvml_mem_util")
    if mem is None:
        return None, _NVML
    return mem, ("NVML utilization.memory over the optimised loop's timed steps; a compute-bound step need not reach "
                 f"it (the big matmul read {pct(run_big.metric('nvml_mem_util'), 1)})")


def raw_matmul(device: Any, peaks: Any, dtype: str) -> Evidence:
    """The best matmul shape the peak search found, over the datasheet peak: its best round, the interval the
    range of its rounds (min..max), so a verdict stands only where every round agrees. Every round is in the note."""
    ds = device.datasheet_tflops(dtype)
    if not (device.is_cuda and ds and dtype in peaks.tflops):
        return None, "needs a CUDA GPU with a datasheet peak; on a CPU there is no tensor-core peak to compare with"
    rate, rounds = peaks.tflops[dtype], peaks.rounds.get(dtype) or [peaks.tflops[dtype]]
    lo, hi = (peaks.interval.get(dtype) if getattr(peaks, "interval", None) else None) or (min(rounds), max(rounds))
    lo, hi = min(lo, rate), max(hi, rate)
    each = ", ".join(pct(100 * r / ds, 1) for r in rounds)
    searched = len(getattr(peaks, "search", {}).get(dtype, []))
    where = (f"best of {searched} shapes searched: {peaks.shape_name(dtype)} (MxNxK)" if searched
             else f"{peaks.matmul_size}³")
    return Estimate(100 * rate / ds, 100 * lo / ds, 100 * hi / ds), (
        f"{dtype.upper()} matmul, {where}: {si(rate * 1e12, 'FLOP/s')} (best of {len(rounds)} rounds) of "
        f"{si(ds * 1e12, 'FLOP/s')} (datasheet); rounds {each}; interval: the range of the rounds")


def good_training(opt_mfu: Estimate | None, opt_step: Any, eager: Any, note: str) -> Evidence:
    """The optimised loop's MFU against the datasheet dense BF16 peak; interval: step-time quartiles."""
    from ..workloads.training import describe

    if opt_mfu is None:
        return None, ("needs a CUDA GPU with a datasheet peak at full size (the optimised loop at smoke size on a CPU "
                      "says nothing about it); see the reference run")
    m = opt_step.config.model
    return opt_mfu, (f"{describe(opt_step.config)}; GPT {m.n_layer}×{m.n_embd}, {si(opt_step.config.tokens_per_step)} "
                     "tokens per step; 6N + 12·L·H·Q·T FLOPs over the datasheet dense BF16 peak; interval: step-time "
                     f"quartiles. {note}The eager step above read {pct(eager.mfu)}")


def record_the_rest(lesson: Any, proxy: Estimate | None) -> None:
    """Other systems' MFU figures beside our proxy (not comparable); labels and tools this course does not test."""
    beside = "beside it: our optimised GPT-2-small loop on one GPU (MFU, % of the BF16 datasheet peak)"
    for key, system in NOT_COMPARABLE.items():
        lesson.not_comparable(key, proxy, f"{system}; {beside}" if proxy else
                              f"{system}; no proxy measured here (needs a GPU at full size)")
    for key, why in UNTESTABLE.items():
        lesson.untested(key, why)


# ---------------------------------------------------------------- tables and figures (they record nothing)

FIELDS = [("nvml_util", "utilization.gpu (%)"), ("nvml_mem_util", "utilization.memory (%)"),
          ("mem_used_gb", "memory.used (GB)"), ("power_w", "power.draw (W)"), ("sm_clock_mhz", "clocks.sm (MHz)"),
          ("gpm_sm_active", "SM active, GPM (%)"), ("gpm_tensor_active", "tensor active, GPM (%)"),
          ("gpm_dram_bw", "DRAM bandwidth, GPM (%)")]


def fields_html(workloads: dict[str, tuple[Any, Any]]) -> str:
    """Every nvidia-smi field (and time, FLOP/s, MFU) for each workload: {name: (RunResult or None, Trace)}."""

    def per_run(fn):
        return ["—" if r is None else fn(r) for r, _ in workloads.values()]

    rows = [[label] + [sig(tr.mean(key)) if tr.mean(key) is not None else "n/a" for _, tr in workloads.values()]
            for key, label in FIELDS]
    rows.append(["time per call"] + per_run(lambda r: si(r.seconds, "s")))
    rows.append(["achieved"] + per_run(lambda r: si(r.tflops and r.tflops * 1e12, "FLOP/s")))
    rows.append(["MFU, datasheet peak"] + per_run(lambda r: pct(r.mfu)))
    rows.append(["share of the measured peak"] + per_run(lambda r: pct(r.mfu_measured_peak)))
    head = "".join(f"<th>{w}</th>" for w in workloads)
    body = "".join("<tr>" + "".join(f"<td style='text-align:{'left' if i == 0 else 'right'}'>{v}</td>"
                                     for i, v in enumerate(r)) + "</tr>" for r in rows)
    return f"<table><tr><th>field</th>{head}</tr>{body}</table>"


LEVELS = [("NVML busy", lambda r: r.metric("nvml_util")), ("SM active (GPM)", lambda r: r.metric("gpm_sm_active")),
          ("tensor active (GPM)", lambda r: r.metric("gpm_tensor_active")),
          ("MFU (datasheet)", lambda r: None if r.mfu is None else 100 * r.mfu)]


def levels_figure(runs: Sequence[tuple[str, Any]], title: str = "three levels of utilization, same FLOPs per call"):
    """Grouped bars, values on each: NVML busy, GPM SM and tensor activity and MFU for each (label, RunResult)."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 3.8), layout="constrained")
    w = 0.8 / len(LEVELS)
    for j, (lname, get) in enumerate(LEVELS):
        vals = [get(r) for _, r in runs]
        xs = [i + (j - (len(LEVELS) - 1) / 2) * w for i in range(len(runs))]
        bars = ax.bar(xs, [v or 0 for v in vals], w, label=lname)
        for b, v in zip(bars, vals):
            ax.annotate("n/a" if v is None else sig(v, 2), (b.get_x() + b.get_width() / 2, b.get_height()),
                        ha="center", va="bottom", fontsize=7)
    ax.set_xticks(range(len(runs)), [n for n, _ in runs])
    ax.set(ylabel="% (each bar)", ylim=(0, 120), title=title)
    ax.legend(fontsize=8, ncol=len(LEVELS), loc="upper left")
    ax.grid(axis="y", alpha=0.3)
    return fig


def bursts_figure(runs: Sequence[Any]):
    """NVML's reading beside the true busy share, one pair of bars per burst pattern, values on the bars."""
    from ..display import plots

    fig = plots.bars([f"{b.burst_ms:g} ms every\n{b.burst_ms + b.gap_ms:g} ms" for b in runs],
                     [b.nvml_pct for b in runs], ref=[b.true_busy_pct for b in runs], fmt=sig,
                     label="NVML utilization.gpu", ref_label="GPU busy (CUDA events)", ylabel="% of the time",
                     title="NVML utilization.gpu (left) beside the true busy share (right)")
    fig.tight_layout()
    return fig


def bursts_html(runs: Sequence[Any]) -> str:
    """A table of burst patterns: burst and gap, periods sampled, true busy share, NVML's reading, misses."""
    rows = "".join(f"<tr><td>{si(r.burst_ms / 1e3, 's')}</td><td>{si(r.gap_ms / 1e3, 's')}</td><td>{len(r.periods)}"
                   f"</td><td>{pct(r.true_busy_pct, 1)}</td><td>{pct(r.nvml_pct, 1)}</td><td>{r.missed_periods}</td>"
                   "</tr>" for r in runs)
    return ("<table><tr><th>burst</th><th>idle gap</th><th>NVML periods</th><th>GPU busy (events)</th>"
            f"<th>NVML utilization.gpu</th><th>periods read as 0%</th></tr>{rows}</table>")


def counts_html(counts: dict[str, tuple[float, float]], title: str) -> str:
    """A table of FLOP counts: {count: (forward FLOPs, training-step FLOPs)}."""
    rows = "".join(f"<tr><td style='text-align:left'>{k}</td><td>{si(f, 'FLOP')}</td><td>{si(t, 'FLOP')}</td></tr>"
                   for k, (f, t) in counts.items())
    return (f"<b>{title}</b><table><tr><th>count</th><th>forward</th><th>training step</th></tr>{rows}</table>")
