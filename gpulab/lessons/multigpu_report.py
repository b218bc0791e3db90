"""Notebook 10's analysis and figures: what the ranks returned, as medians with intervals, and claims checked on them.

Nothing here measures: these functions take the per-rank results of `gpulab.lessons.multigpu_lab` (through
`gpulab.distributed.launch`) and reduce them. A round's time is the slowest rank's (a collective step ends
when the last rank ends); every figure is a median over rounds with its quartiles as the interval.
"""
from __future__ import annotations

from typing import Any, Sequence

from ..experiment import Claim, Comparison, RunResult
from ..flops import mfu as _mfu
from .multigpu_lab import bus_bandwidth_gbs
from ..timing import Measurement, quantiles


def slowest_rank(per_rank: Sequence[Sequence[float]]) -> list[float]:
    """Round by round, the slowest rank's time."""
    if not per_rank or any(len(r) != len(per_rank[0]) for r in per_rank):
        raise ValueError("per_rank must hold one equally long list of round times per rank")
    return [max(r[i] for r in per_rank) for i in range(len(per_rank[0]))]


def median_interval(values: Sequence[float]) -> tuple[float, float, float]:
    """(median, q1, q3) of the rounds."""
    q1, med, q3 = quantiles(list(values))
    return med, q1, q3


def allreduce_table(rank_results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per message size: time per all-reduce, algbw and busbw (GB/s, median and interval over rounds)."""
    world = rank_results[0]["world_size"]
    rows = []
    for i, size in enumerate(rank_results[0]["sizes"]):
        times = slowest_rank([r["sizes"][i]["times_s"] for r in rank_results])
        t, t_lo, t_hi = median_interval(times)
        nbytes = size["bytes"]
        bus = (lambda s: bus_bandwidth_gbs(nbytes, s, world)) if world > 1 else (lambda s: 0.0)
        rows.append({"bytes": nbytes, "iters": size["iters"], "time_us": t * 1e6, "algbw_gbs": nbytes / t / 1e9,
                     "busbw_gbs": bus(t), "busbw_low": bus(t_hi), "busbw_high": bus(t_lo), "rounds": len(times)})
    return rows


def train_table(rank_results: list[dict[str, Any]], peak_tflops: float | None) -> list[dict[str, Any]]:
    """Per configuration: step time, tokens/s (all ranks), tokens/s and MFU per GPU, peak memory, with intervals."""
    world = rank_results[0]["world_size"]
    rows = []
    for i, conf in enumerate(rank_results[0]["configs"]):
        times = slowest_rank([r["configs"][i]["step_s"] for r in rank_results])
        t, t_lo, t_hi = median_interval(times)
        tok = conf["tokens_per_step"] * world
        per_gpu = tok / t / world
        mems = [r["configs"][i]["peak_memory_gb"] for r in rank_results]
        rows.append({"label": conf["label"], "world": world, "step_ms": t * 1e3, "step_times_s": times,
                     "tokens_per_step": tok, "tokens_per_s": tok / t, "tokens_per_s_low": tok / t_hi,
                     "tokens_per_s_high": tok / t_lo, "tokens_per_s_per_gpu": per_gpu,
                     "mfu_per_gpu": _mfu(conf["flops_per_token"] * per_gpu, 1.0, peak_tflops) if peak_tflops else None,
                     "peak_memory_gb": None if None in mems else max(mems), "loss": conf["loss"],
                     "flops_per_token": conf["flops_per_token"], "matmul_dtype": conf["matmul_dtype"],
                     "profile": [r["configs"][i].get("profile") for r in rank_results]})
    return rows


def scaling_efficiency(one: dict[str, Any], many: dict[str, Any]) -> tuple[float, float, float]:
    """tokens/s on N GPUs over N x tokens/s on one, with the interval from both sides' quartiles."""
    n = many["world"] / one["world"]
    eff = many["tokens_per_s"] / (n * one["tokens_per_s"])
    return eff, many["tokens_per_s_low"] / (n * one["tokens_per_s_high"]), \
        many["tokens_per_s_high"] / (n * one["tokens_per_s_low"])


def ratio_interval(num: dict[str, Any], den: dict[str, Any], key: str = "tokens_per_s") -> tuple[float, float, float]:
    """num/den of a throughput, with the interval from both sides' quartiles."""
    return (num[key] / den[key], num[f"{key}_low"] / den[f"{key}_high"], num[f"{key}_high"] / den[f"{key}_low"])


def as_comparison(name: str, before: dict[str, Any], after: dict[str, Any], *, peak_tflops: float | None,
                  device: str, traces: tuple[Any, Any] = (None, None), notes: list[str] | None = None,
                  kind: str = "demonstration") -> Comparison:
    """Two rows of `train_table` as a gpulab Comparison, both sides per the after side's tokens per step."""
    tok = after["tokens_per_step"]
    runs = []
    for row, trace in zip((before, after), traces):
        scale = tok / row["tokens_per_step"]
        m = Measurement(label=row["label"], times_s=[s * scale for s in row["step_times_s"]], timer="perf_counter")
        runs.append(RunResult(label=row["label"], measurement=m, flops=row["flops_per_token"] * tok,
                              dtype=row["matmul_dtype"], peak_tflops=peak_tflops * row["world"] if peak_tflops else None,
                              items=tok, item_name="tokens", trace=trace))
    return Comparison(name=name, before=runs[0], after=runs[1], device=device, notes=notes or [], kind=kind)


# ---------------------------------------------------------------- claims

def claim(text: str, *, low: float | None = None, high: float | None = None, unit: str = "x", source: str = "",
          evidence: str = "measured") -> Claim:
    """A Claim with its kind of evidence."""
    return Claim(text, low=low, high=high, unit=unit, source=source, evidence=evidence)


def check(c: Claim, value: float | None, interval: tuple[float, float] | None, *, note: str = "",
          measurement: str | None = None) -> Claim:
    """Check a claim on a median and its interval (the interval decides)."""
    if value is None:
        return c.untestable(note or "not measured in this run")
    return c.check(value, interval=interval, note=note, measurement=measurement)


def not_comparable(c: Claim, proxy: float | None, reason: str) -> Claim:
    """Another system's number: show our proxy beside it rather than a verdict."""
    return c.not_comparable(proxy, reason)


# ---------------------------------------------------------------- figures

def plot_bandwidth(rows: list[dict[str, Any]], *, link_gbs: float | None, link_label: str = "",
                   ref_rows: list[dict[str, Any]] | None = None, ref_label: str = "reference", title: str = ""):
    """Bus bandwidth against message size (log-log), its interval shaded, the link's limit as a line."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 3.8))
    xs = [r["bytes"] for r in rows]
    ax.plot(xs, [r["busbw_gbs"] for r in rows], "o-", color="#00798c", label="this run (busbw)")
    ax.fill_between(xs, [r["busbw_low"] for r in rows], [r["busbw_high"] for r in rows], color="#00798c", alpha=0.2)
    if ref_rows:
        ax.plot([r["bytes"] for r in ref_rows], [r["busbw_gbs"] for r in ref_rows], "s--", color="#8d8d8d",
                label=ref_label)
    if link_gbs:
        ax.axhline(link_gbs, color="#d1495b", ls=":", label=f"link limit {link_gbs:,.0f} GB/s {link_label}")
    ax.set_xscale("log", base=2)
    ax.set_yscale("symlog", linthresh=0.1)
    ax.set_xlabel("message size (bytes)")
    ax.set_ylabel("bus bandwidth (GB/s)")
    ax.set_title(title or "all-reduce bus bandwidth vs message size")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def plot_overlap(profiles: list[dict[str, Any] | None], title: str = ""):
    """One lane per rank: compute intervals and communication intervals of the profiled steps."""
    import matplotlib.pyplot as plt

    profiles = [p for p in profiles if p]
    fig, ax = plt.subplots(figsize=(9, 0.9 + 0.8 * max(1, len(profiles))))
    for i, p in enumerate(profiles):
        for key, color, y in (("compute", "#00798c", i + 0.1), ("comm", "#d1495b", i - 0.3)):
            ax.broken_barh([(s, max(e - s, 1e-3)) for s, e in p[key]], (y, 0.35), color=color,
                           label=("compute" if key == "compute" else "communication") if i == 0 else None)
    ax.set_yticks(range(len(profiles)), [f"rank {i}" for i in range(len(profiles))])
    ax.set_xlabel("ms since the first profiled event")
    ax.set_title(title or "communication (red) under compute (teal), per rank")
    if profiles:
        ax.legend(fontsize=8, loc="upper right")
    fig.tight_layout()
    return fig


def find_reference(notebook: str = "10_multi_gpu") -> dict[str, Any] | None:
    """The committed reference run of `notebook` on any reference machine (a multi-GPU run lives beside the others)."""
    from ..results import data_dir, load_reference, load_result

    ref = load_reference(notebook)
    if ref is not None:
        return ref
    for path in sorted((data_dir() / "reference").glob(f"*/{notebook}.json")):
        return load_result(path)
    return None
