"""Notebook 10's rank-side workloads: NCCL all-reduce bandwidth, DDP and FSDP2 training steps, overlap traces.

Each `*_rank` function runs on every rank under `gpulab.distributed.launch` and returns plain JSON: per-round
times, memory, overlap. The link's limit (`link_limit`) is what NVML reports for this GPU's NVLink or PCIe.
Analysis of what the ranks return (medians, intervals, scaling) lives in `gpulab.lessons.multigpu_report`.

    launch("gpulab.lessons.multigpu_lab:allreduce_rank", kwargs={"sizes": [2**20, 2**30]})
    launch("gpulab.lessons.multigpu_lab:train_rank", kwargs={"model": {...}, "configs": [{"wrap": "ddp"}, {"wrap": "fsdp2"}]})
"""
from __future__ import annotations

import contextlib
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

# ---------------------------------------------------------------- the link's limit, as the device reports it

# Unidirectional GB/s of one NVLink link, keyed by NVML's version number (nvml.h NVML_NVLINK_VERSION_*: 1 = 1.0,
# 2 = 2.0, 3 = 2.2, 4 = 3.0, 5 = 3.1, 6 = 4.0, 7 = 5.0). Each is NVIDIA's per-GPU total for that generation over
# its link count, halved for one direction: 1.0 P100 160 GB/s over 4 links; 2.x V100 300 GB/s over 6;
# 3.x A100 600 GB/s over 12; 4.0 H100/H200 900 GB/s over 18; 5.0 B200 1.8 TB/s over 18.
NVLINK_GBS_PER_LINK = {1: 20.0, 2: 25.0, 3: 25.0, 4: 25.0, 5: 25.0, 6: 25.0, 7: 50.0}
NVLINK_NAMES = {1: "1.0", 2: "2.0", 3: "2.2", 4: "3.0", 5: "3.1", 6: "4.0", 7: "5.0"}
NVLINK_SOURCE = ("NVIDIA NVLink product page (nvidia.com/en-us/data-center/nvlink/): bidirectional GB/s per GPU "
                 "by generation / links / 2; version numbers from nvml.h")
# Unidirectional GB/s per PCIe lane after line encoding (8b/10b for Gen1-2, 128b/130b for Gen3-5, FLIT for Gen6).
PCIE_GBS_PER_LANE = {1: 0.25, 2: 0.5, 3: 0.985, 4: 1.969, 5: 3.938, 6: 7.563}
PCIE_SOURCE = "PCI-SIG base specifications: 2.5/5/8/16/32/64 GT/s per lane and their encodings"


@dataclass
class LinkInfo:
    """The GPU-to-GPU link this device reports, and its unidirectional bandwidth limit per GPU (GB/s)."""

    kind: str | None  # "nvlink", "pcie", or None (no GPU, no NVML)
    limit_gbs: float | None
    detail: str
    source: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def link_limit(device_index: int | None, nvml: Any = None) -> LinkInfo:
    """NVLink links up x per-link GB/s by NVLink version; else PCIe lanes x per-lane GB/s; else None, said why."""
    if device_index is None:
        return LinkInfo(None, None, "no CUDA GPU: no link to measure against")
    try:
        nv = nvml
        if nv is None:
            import pynvml as nv
        nv.nvmlInit()
        h = nv.nvmlDeviceGetHandleByIndex(device_index)
    except Exception as e:  # no nvidia-ml-py, no driver, no permission
        return LinkInfo(None, None, f"NVML unavailable: {type(e).__name__}: {e}")
    up, versions = 0, set()
    for link in range(getattr(nv, "NVML_NVLINK_MAX_LINKS", 18)):
        try:
            if nv.nvmlDeviceGetNvLinkState(h, link) == getattr(nv, "NVML_FEATURE_ENABLED", 1):
                up += 1
                versions.add(int(nv.nvmlDeviceGetNvLinkVersion(h, link)))
        except Exception:  # NotSupported past the last link, or no NVLink at all
            continue
    if up:
        v = max(versions)
        per = NVLINK_GBS_PER_LINK.get(v)
        name = NVLINK_NAMES.get(v, f"version {v}")
        if per is None:
            return LinkInfo("nvlink", None, f"{up} NVLink links up, NVML version {v}: not in gpulab's table")
        return LinkInfo("nvlink", up * per, f"{up} NVLink {name} links up x {per:g} GB/s per direction", NVLINK_SOURCE)
    try:
        gen = max(nv.nvmlDeviceGetCurrPcieLinkGeneration(h), nv.nvmlDeviceGetMaxPcieLinkGeneration(h))
        width = max(nv.nvmlDeviceGetCurrPcieLinkWidth(h), nv.nvmlDeviceGetMaxPcieLinkWidth(h))
    except Exception as e:
        return LinkInfo(None, None, f"no NVLink up, and NVML gives no PCIe link: {type(e).__name__}: {e}")
    per = PCIE_GBS_PER_LANE.get(int(gen))
    if per is None:
        return LinkInfo("pcie", None, f"PCIe Gen{gen} x{width}: not in gpulab's table")
    # An idle link trains down to save power: the generation and width it can run at are the limit.
    return LinkInfo("pcie", per * width, f"no NVLink up; PCIe Gen{gen} x{width} at {per:g} GB/s per lane and "
                    "direction (a GPU-to-GPU copy may cross a switch or the CPU, which can be slower)", PCIE_SOURCE)


def bus_bandwidth_gbs(nbytes: float, seconds: float, world_size: int) -> float:
    """All-reduce bus bandwidth as nccl-tests defines it: algbw (bytes / time) x 2(n-1)/n, in GB/s.

    A ring all-reduce moves 2(n-1)/n of the buffer over each GPU's link, so busbw is comparable to the link's
    unidirectional bandwidth whatever the number of ranks (it is 0 for one rank: nothing crosses a link).
    """
    if nbytes <= 0 or seconds <= 0:
        raise ValueError(f"nbytes={nbytes!r} and seconds={seconds!r} must be > 0")
    if not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size={world_size!r} must be an integer >= 1")
    return nbytes / seconds / 1e9 * 2 * (world_size - 1) / world_size


# ---------------------------------------------------------------- rank side: all-reduce sweep

def _agree_on_count(ctx: Any, seconds_per_op: float, target_s: float, cap: int) -> int:
    """Every rank must run the same number of collectives: size the count from the slowest rank's estimate."""
    import torch.distributed as dist

    t = torch.tensor([seconds_per_op], device=ctx.device, dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return int(min(cap, max(1, target_s / max(t.item(), 1e-7))))


def _timed(ctx: Any, fn, iters: int) -> float:
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


def allreduce_rank(ctx: Any, *, sizes: list[int], rounds: int = 5, round_s: float = 0.05, warmup: int = 3,
                   max_iters: int = 2000) -> dict[str, Any]:
    """Time `dist.all_reduce` (sum, FP32) of each size in bytes: `rounds` rounds of about `round_s` seconds each.

    Returns per size the seconds per all-reduce in each round, on this rank; a round starts after a barrier.
    """
    import torch.distributed as dist

    from ..distributed import RankContext  # noqa: F401  (ctx is a RankContext)

    out = []
    gen = torch.Generator(device=ctx.device).manual_seed(1234 + ctx.rank)
    for nbytes in sizes:
        n = max(1, int(nbytes) // 4)
        buf = torch.randn(n, device=ctx.device, generator=gen)  # random data, never zeros
        op = lambda: dist.all_reduce(buf)  # noqa: E731  (sum; the values grow, the bytes moved do not)
        for _ in range(warmup):
            op()
        ctx.synchronize()
        t0 = time.perf_counter()
        op()
        ctx.synchronize()
        iters = _agree_on_count(ctx, time.perf_counter() - t0, round_s, max_iters)
        times = []
        for _ in range(rounds):
            ctx.barrier()
            times.append(_timed(ctx, op, iters))
            buf.normal_(generator=gen)
        out.append({"bytes": n * 4, "iters": iters, "times_s": times})
        del buf
    link = link_limit(ctx.local_rank if ctx.device.type == "cuda" else None)
    return {"rank": ctx.rank, "world_size": ctx.world_size, "sizes": out, "link": link.to_dict()}


# ---------------------------------------------------------------- rank side: training steps

def _random_batches(vocab: int, batch: int, seq: int, count: int, device: torch.device, seed: int):
    """`count` (x, y) batches of random token windows, made once on the device (no data loading in the timing)."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    stream = torch.randint(vocab, (batch * count * (seq + 1) * 2,), generator=g)
    out = []
    for i in range(count):
        starts = torch.randint(stream.numel() - seq - 1, (batch,), generator=g)
        win = torch.stack([stream[s:s + seq + 1] for s in starts.tolist()]).to(device)
        out.append((win[:, :-1].contiguous(), win[:, 1:].contiguous()))
    return out


def _wrap(model: torch.nn.Module, conf: dict[str, Any], ctx: Any) -> torch.nn.Module:
    """The model as `conf["wrap"]` says: "none", "ddp" (with its bucket knobs) or "fsdp2" (fully_shard per block)."""
    wrap = conf.get("wrap", "ddp")
    if wrap == "none":
        return model
    if wrap == "ddp":
        from torch.nn.parallel import DistributedDataParallel as DDP

        ids = [ctx.local_rank] if ctx.device.type == "cuda" else None
        return DDP(model, device_ids=ids, bucket_cap_mb=conf.get("bucket_cap_mb", 25),
                   gradient_as_bucket_view=conf.get("gradient_as_bucket_view", False))
    if wrap == "fsdp2":
        from torch.distributed.fsdp import fully_shard  # torch >= 2.6

        for block in model.blocks:  # one shard group per transformer block: gathered just before it runs
            fully_shard(block)
        fully_shard(model)  # the rest: embeddings (tied to lm_head), final LayerNorm
        return model
    raise ValueError(f"wrap={wrap!r} is not supported; allowed: none, ddp, fsdp2")


def _step_fn(model, opt, batches, conf: dict[str, Any], autocast_dtype):
    """One optimizer step: `grad_accum` micro-batches (no_sync() on all but the last when asked), then AdamW."""
    accum, skip_sync = conf.get("grad_accum", 1), conf.get("no_sync", False)
    state = {"i": 0}
    device_type = batches[0][0].device.type

    def step():
        for k in range(accum):
            x, y = batches[state["i"] % len(batches)]
            state["i"] += 1
            last = k == accum - 1
            sync = contextlib.nullcontext()
            if skip_sync and not last and hasattr(model, "no_sync"):
                sync = model.no_sync()  # DDP: keep the gradients local, all-reduce once after the last micro-batch
            elif hasattr(model, "set_requires_gradient_sync"):
                model.set_requires_gradient_sync(last or not skip_sync)  # FSDP2's equivalent
            with sync:  # forward and backward both inside: DDP's gradient hooks fire during the backward
                with torch.autocast(device_type, dtype=autocast_dtype or torch.bfloat16,
                                    enabled=autocast_dtype is not None):
                    loss = model(x, y)[1]
                (loss / accum).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    return step


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


def _profile_overlap(step, ctx: Any, steps: int, trace_dir: str | None, label: str) -> dict[str, Any]:
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


def train_rank(ctx: Any, *, model: dict[str, Any], batch_size: int, seq_len: int, configs: list[dict[str, Any]],
               rounds: int = 5, steps_per_round: int = 5, warmup_steps: int = 3, profile_label: str | None = None,
               profile_steps: int = 2, trace_dir: str | None = None) -> dict[str, Any]:
    """Train the course's GPT for each configuration: per-round seconds, peak memory, and (once) an overlap trace.

    Args:
        model: GPTConfig fields. batch_size, seq_len: per rank and micro-batch.
        configs: each {"label", "wrap": none|ddp|fsdp2, "bucket_cap_mb", "gradient_as_bucket_view",
            "grad_accum", "no_sync"}; every rank gets different data (seeded by rank).
        profile_label: the configuration whose steps are profiled for communication/compute overlap.
    """
    from ..training import TrainConfig, build_model
    from ..workloads import GPTConfig

    cuda = ctx.device.type == "cuda"
    if cuda:
        torch.backends.cuda.matmul.allow_tf32 = True
    autocast_dtype = torch.bfloat16 if cuda else None
    results = []
    for conf in configs:
        cfg = TrainConfig(model=GPTConfig(**model), batch_size=batch_size, seq_len=seq_len,
                          grad_accum=conf.get("grad_accum", 1), attn="sdpa", autocast="bf16" if cuda else None)
        if cuda:
            torch.cuda.empty_cache()
            base = torch.cuda.memory_allocated(ctx.device)
            torch.cuda.reset_peak_memory_stats(ctx.device)
        net = _wrap(build_model(cfg).to(ctx.device), conf, ctx)
        opt = torch.optim.AdamW(net.parameters(), lr=3e-4, betas=(0.9, 0.95), weight_decay=0.1)
        batches = _random_batches(cfg.vocab_size, batch_size, seq_len, 4, ctx.device, seed=1000 * ctx.rank + 7)
        step = _step_fn(net, opt, batches, conf, autocast_dtype)
        for _ in range(warmup_steps):
            loss = step()
        ctx.synchronize()
        times = []
        for _ in range(rounds):
            ctx.barrier()
            t0 = time.perf_counter()
            for _ in range(steps_per_round):
                loss = step()
            ctx.synchronize()
            times.append((time.perf_counter() - t0) / steps_per_round)
        row = {"label": conf.get("label", conf.get("wrap", "ddp")), "conf": conf, "step_s": times,
               "median_step_s": statistics.median(times), "tokens_per_step": cfg.tokens_per_step,
               "flops_per_token": cfg.flops_per_token(), "loss": float(loss.detach().float().item()),
               "peak_memory_gb": (torch.cuda.max_memory_allocated(ctx.device) - base) / 1e9 if cuda else None,
               "params": sum(p.numel() for p in net.parameters()), "matmul_dtype": cfg.matmul_dtype}
        if profile_label and row["label"] == profile_label:
            row["profile"] = _profile_overlap(step, ctx, profile_steps, trace_dir, profile_label.replace(" ", "_"))
        results.append(row)
        del net, opt, batches, step
        ctx.barrier()
    return {"rank": ctx.rank, "world_size": ctx.world_size, "device": str(ctx.device), "configs": results}
