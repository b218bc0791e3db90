"""Notebook 10's data and helpers: its claims, what a rank's worker reuses (timing, random batches, the overlap
of communication with compute), and the reduction of what the ranks return into medians, intervals and figures.

A round's time is the slowest rank's (a collective step ends when the last rank ends).
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Sequence

import torch

from ..tools.links import bus_bandwidth_gbs
from ..verdicts.experiment import Comparison, RunResult
from ..measuring.flops import mfu as _mfu
from ..verdicts.lesson import ClaimSpec
from ..measuring.measurement import Measurement, quantiles

_COURSE = "course target for 2 GPUs on one NVLink host"
CLAIMS = [
    ClaimSpec("allreduce_link_share", "All-reduce bus bandwidth at large messages reaches >= 70% of the link's limit",
              low=70, unit="%", source=_COURSE,
              quote="course target: all-reduce bus bandwidth at large messages >= 70% of the link's limit",
              needs=("multi_gpu",)),
    ClaimSpec("ddp_scaling", "DDP scaling efficiency from 1 to N GPUs is >= 90%", low=90, unit="%", source=_COURSE,
              quote="course target: DDP scaling efficiency >= 90% from 1 to N GPUs", needs=("multi_gpu",)),
    ClaimSpec("fsdp2_memory", "FSDP2's peak memory per GPU is below DDP's (ratio FSDP2/DDP < 1)", high=1.0,
              unit="x", source=_COURSE, quote="course target: FSDP2's peak memory per GPU below DDP's",
              needs=("multi_gpu",), timed=False),
    ClaimSpec("gpt3_mfu", "Transformer (GPT-3 175B on 8xA100): expected MFU 45-55%, communication overhead", 45, 55,
              "%", "guide §2.3", quote="Expected MFU: 45-55%"),
    ClaimSpec("vlm_mfu", "MFU ~58% after optimization (good for multi-GPU VLM)", 53, 63, "%", "guide §8.3",
              quote="MFU estimate: ~58% (good for multi-GPU VLM)"),
    ClaimSpec("modal_mfu", "50-60% MFU is excellent for transformers (communication overhead)", 50, 60, "%",
              "guide §1 (Modal)", quote="50-60% MFU is excellent for transformers (communication overhead)"),
    ClaimSpec("deepseek_mfu", "DeepSeek-v3: 20-30% MFU (communication bottleneck)", 20, 30, "%", "000 summary",
              quote="DeepSeek-v3: 20-30% MFU (communication bottleneck)"),
    ClaimSpec("global_batch", "8 GPUs x batch 8 with gradient_accumulation_steps 8 gives a global batch of 64", 64,
              64, "samples", "guide §8.2 step 3", evidence="arithmetic",
              quote="8 GPUs × 8 batch × 1 accum = 64 global"),
]
# why the other systems' MFU figures are not comparable with our data-parallel GPT
OTHER_SYSTEMS = {"gpt3_mfu": "GPT-3 175B with model parallelism on 8 A100s; ours is a small GPT, data-parallel",
                 "vlm_mfu": "a vision-language model on 8xA100 with its own data pipeline",
                 "modal_mfu": "a rule of thumb across models and cluster sizes",
                 "deepseek_mfu": "a mixture-of-experts model on thousands of GPUs with all-to-all traffic"}


def plausible_scaling(efficiency_low: float, backend: str) -> str | None:
    """Why a scaling efficiency cannot be read as a GPU's (None when it can): over 100% (more than N-fold from N
    ranks: the one-rank baseline was slowed by something N ranks did not share) or CPU processes (they share this
    machine's cores and memory, so the number measures their contention, not a link)."""
    if efficiency_low > 1.0:
        return "scaling efficiency over 100%: more than N-fold from N ranks is not a real gain"
    if backend != "nccl":
        return "CPU processes (gloo) share this machine's cores: not a GPU's scaling"
    return None


# ---------------------------------------------------------------- what a rank's worker reuses

def agree_on_count(ctx: Any, seconds_per_op: float, target_s: float, cap: int) -> int:
    """Every rank must run the same number of collectives: size the count from the slowest rank's estimate."""
    import torch.distributed as dist

    t = torch.tensor([seconds_per_op], device=ctx.device, dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return int(min(cap, max(1, target_s / max(t.item(), 1e-7))))


def timed(ctx: Any, fn, iters: int) -> float:
    """Seconds per call of `fn` over `iters` calls: CUDA events on a GPU, the host clock on a CPU."""
    if ctx.device.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3 / iters
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    return (time.perf_counter() - t0) / iters


def random_batches(vocab: int, batch: int, seq: int, count: int, device: torch.device, seed: int):
    """`count` (x, y) batches of random token windows, made once on the device (no data loading in the timing)."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    stream = torch.randint(vocab, (batch * count * (seq + 1) * 2,), generator=g)
    out = []
    for i in range(count):
        starts = torch.randint(stream.numel() - seq - 1, (batch,), generator=g)
        win = torch.stack([stream[s:s + seq + 1] for s in starts.tolist()]).to(device)
        out.append((win[:, :-1].contiguous(), win[:, 1:].contiguous()))
    return out


def overlap_fraction(comm: list[tuple[float, float]], compute: list[tuple[float, float]]) -> float | None:
    """Share of communication time during which some compute ran: 1.0 fully hidden, 0.0 fully exposed."""
    total = sum(e - s for s, e in comm)
    if total <= 0:
        return None
    merged: list[list[float]] = []
    for s, e in sorted(compute):
        if merged and s <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], e)
        else:
            merged.append([s, e])
    covered = sum(max(0.0, min(e, me) - max(s, ms)) for s, e in comm for ms, me in merged)
    return covered / total


_COMM_MARKERS = ("nccl", "gloo", "allreduce", "all_reduce", "reduce_scatter", "all_gather", "allgather")


def profile_overlap(step, ctx: Any, steps: int, trace_dir: str | None, label: str) -> dict[str, Any]:
    """Profile `steps` steps: communication vs compute intervals, their overlap, and a small timeline."""
    from torch.profiler import ProfilerActivity, profile

    cuda = ctx.device.type == "cuda"
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    step()
    ctx.synchronize()
    with profile(activities=acts) as prof:
        for _ in range(steps):
            step()
        ctx.synchronize()
    if trace_dir:
        Path(trace_dir).mkdir(parents=True, exist_ok=True)
        prof.export_chrome_trace(str(Path(trace_dir) / f"{label}_rank{ctx.rank}.json"))
    kind = torch.autograd.DeviceType.CUDA if cuda else torch.autograd.DeviceType.CPU
    comm, compute = [], []
    for e in prof.events():
        if e.device_type != kind:
            continue
        name = e.name.lower()
        iv = (e.time_range.start / 1e3, e.time_range.end / 1e3)  # µs -> ms
        if any(m in name for m in _COMM_MARKERS):
            comm.append(iv)
        elif cuda and not name.startswith(("memcpy", "memset")):
            compute.append(iv)  # a GPU kernel that is not communication
        elif not cuda and name in ("aten::mm", "aten::addmm", "aten::bmm"):
            compute.append(iv)  # on a CPU: the matmuls stand for compute (other ops nest inside each other)
    t0 = min([s for s, _ in comm + compute], default=0.0)
    shift = lambda ivs: [(round(s - t0, 4), round(e - t0, 4)) for s, e in sorted(ivs)][:4000]  # noqa: E731
    return {"label": label, "steps": steps, "overlap": overlap_fraction(comm, compute),
            "comm_ms": sum(e - s for s, e in comm), "compute_ms": sum(e - s for s, e in compute),
            "comm": shift(comm), "compute": shift(compute), "device_kernels": cuda}


# ---------------------------------------------------------------- what the ranks returned

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


# ---------------------------------------------------------------- figures

def _bytes_label(n: float) -> str:
    """1 KiB, 4 KiB, ... 1 GiB: a message size in binary units."""
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"{n / size:g} {unit}"
    return f"{n:g} B"


def plot_bandwidth(rows: list[dict[str, Any]], *, link_gbs: float | None, link_label: str = "",
                   ref_rows: list[dict[str, Any]] | None = None, ref_label: str = "reference", title: str = ""):
    """Bus bandwidth against message size (log-log), its interval shaded, the link's limit as a line."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 3.8))
    xs = [r["bytes"] for r in rows]
    shown = [v for r in [*rows, *(ref_rows or [])] for v in (r["busbw_gbs"], r["busbw_low"], r["busbw_high"]) if v]
    floor = min([v for v in shown if v > 0] or [1e-3]) / 2  # a log axis: no zero, no negative decades
    clamp = lambda vs: [max(v or 0.0, floor) for v in vs]  # noqa: E731
    ax.plot(xs, clamp([r["busbw_gbs"] for r in rows]), "o-", color="#00798c", label="this run (busbw)")
    ax.fill_between(xs, clamp([r["busbw_low"] for r in rows]), clamp([r["busbw_high"] for r in rows]),
                    color="#00798c", alpha=0.2)
    if ref_rows:
        ax.plot([r["bytes"] for r in ref_rows], clamp([r["busbw_gbs"] for r in ref_rows]), "s--", color="#8d8d8d",
                label=ref_label)
    if link_gbs:
        ax.axhline(link_gbs, color="#d1495b", ls=":", label=f"link limit {link_gbs:,.0f} GB/s {link_label}")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_ylim(bottom=floor)
    if xs:
        ax.set_xlim(min(xs) / 1.2, max(xs) * 1.2)
    ax.set_xticks(xs, [_bytes_label(x) for x in xs], fontsize=8)
    ax.xaxis.set_minor_locator(plt.NullLocator())
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
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))  # beside the lanes, never on them
    fig.tight_layout()
    return fig


def find_reference(notebook: str = "10_multi_gpu") -> dict[str, Any] | None:
    """The committed reference run of `notebook` on any reference machine (a multi-GPU run lives beside the others)."""
    from ..measuring.files import data_dir
    from ..verdicts.results import load_reference, load_result

    ref = load_reference(notebook)
    if ref is not None:
        return ref
    for path in sorted((data_dir() / "reference").glob(f"*/{notebook}.json")):
        return load_result(path)
    return None
