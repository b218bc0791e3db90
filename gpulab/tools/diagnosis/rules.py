"""Rules: evidence (a JSON-ready dict of measured numbers) -> findings. Pure functions, each with its threshold.

The evidence's keys (see evidence.py): gpu, step_ms, busy, idle {host_launching, after_sync, queued} (shares of
the step), classes {class: share of the step}, kernels_per_step, syncs_per_step (None: cannot tell), sync_calls,
sync_wait (the host's time blocked in syncs, a share of the step),
loader_wait_share (None: no loader), batch_size, memory_headroom, conv, channels_last, optimizer {class, foreach,
fused, tensors, share}, mfu. A share is of the profiled step: what removing that time could win at most.
"""
from __future__ import annotations

from typing import Any, Callable

from .report import Finding

# Thresholds: a finding needs its share of the step at or above these.
LAUNCH_IDLE = 0.20  # GPU idle while the host launches the next kernel (no sync before it)
SYNC_IDLE = 0.05  # GPU idle after a synchronizing call, and while the host refills the queue it drained
DATA_WAIT = 0.10  # host time per step spent waiting for the loader's next batch
SMALL_BATCH_MAX = 64  # samples per step at or under which a batch counts as small ...
SMALL_BATCH_IDLE = 0.25  # ... when the GPU is idle this share of the step ...
SMALL_BATCH_HEADROOM = 0.5  # ... and this share of its memory is still free
FP32_MATMUL = 0.10  # matmuls and convolutions off the tensor cores (FP32 kernels)
ATTENTION = 0.05  # kernels of a hand-written attention's score matrix (and no fused attention kernel in the step)
LAYOUT = 0.03  # NCHW <-> NHWC conversion kernels around convolutions
OPTIMIZER = 0.10  # the optimizer's step, when it is neither fused nor foreach
OPTIMIZER_TENSORS = 8  # ... over at least this many parameter tensors
ELEMENTWISE = 0.25  # elementwise and reduction kernels outside the optimizer (memory-bound chains)

GPU_ONLY = ("launch_bound", "sync", "small_batch", "fp32_matmul", "layout", "elementwise")
CPU_NOTES = ("On a CPU there is no separate device to wait: a .item() costs nothing extra, so syncs mean nothing "
             "here; the loader's wait is real, but its workers share the cores the step computes on.",
             "torch's optimizers loop over tensors on a CPU by default (foreach is their CUDA default): an optimizer "
             "finding here may not hold on a GPU.")


def _idle(ev: dict[str, Any], key: str) -> float:
    return float((ev.get("idle") or {}).get(key) or 0.0)


def _not_waiting_for_data(ev: dict[str, Any], idle: float) -> float:
    """Idle time less the loader's wait: while the host waits for a batch, the GPU's idle is not launch overhead."""
    return max(0.0, idle - float(ev.get("loader_wait_share") or 0.0))


def _cls(ev: dict[str, Any], key: str) -> float:
    return float((ev.get("classes") or {}).get(key) or 0.0)


def sync_share(ev: dict[str, Any]) -> float:
    """What removing the step's syncs could win: the idle right after them, and the idle while the host refills a
    drained queue, at most the host's time blocked in them (without the syncs it queues work meanwhile)."""
    n = ev.get("syncs_per_step")
    if not n or n < 1:
        return 0.0
    after = _idle(ev, "after_sync")
    idle = sum(float(v or 0.0) for v in (ev.get("idle") or {}).values())
    return max(after, min(float(ev.get("sync_wait") or 0.0), idle))


def launch_bound(ev: dict[str, Any]) -> Finding | None:
    """The GPU waits on the host's launches: small kernels, Python overhead (less the idle a sync causes)."""
    refill = max(0.0, sync_share(ev) - _idle(ev, "after_sync"))
    share = max(0.0, _not_waiting_for_data(ev, _idle(ev, "host_launching")) - refill)
    if share < LAUNCH_IDLE:
        return None
    return Finding("launch_bound", share, {"idle_host_launching": share, "kernels_per_step": ev.get("kernels_per_step"),
                                           "busy": ev.get("busy")},
                   "model = torch.compile(model)  # fewer, fused kernels; or CUDA graphs (mode='reduce-overhead')",
                   "03_fusion, 09_profiling",
                   f"GPU idle {share:.0%} of the step while the host launches {ev.get('kernels_per_step') or 0:.0f} "
                   "kernels")


def sync(ev: dict[str, Any]) -> Finding | None:
    """A synchronizing call per step drains the GPU's queue."""
    n, share = ev.get("syncs_per_step"), sync_share(ev)
    if share < SYNC_IDLE:
        return None
    calls = list(ev.get("sync_calls") or [])[:3]
    return Finding("sync", share, {"syncs_per_step": n, "idle_after_sync": _idle(ev, "after_sync"),
                                   "host_blocked_in_syncs": ev.get("sync_wait"), "calls": calls},
                   "log loss.detach() and read it every N steps; no .item()/print(tensor)/bool(tensor) per step",
                   "04_sync_points", f"{n:.0f} synchronizing call(s) per step; GPU idle {share:.0%} after them, "
                   "while the host refills the drained queue",
                   why="the sync is in your code: gl.find_syncs(step) names it; gpulab cannot remove it for you")


def suggested_workers(cores: int | None) -> int:
    """The loader workers the fix suggests and its trial runs: the host's cores, 2 to 8 (8 where unknown)."""
    return max(2, min(8, cores or 8))


def data_wait(ev: dict[str, Any]) -> Finding | None:
    """The step waits for the loader's next batch."""
    share = ev.get("loader_wait_share")
    if share is None or share < DATA_WAIT:
        return None
    pin = ", pin_memory=True" if ev.get("gpu") else ""
    return Finding("data_wait", float(share), {"loader_wait_share": share, "loader_wait_ms": ev.get("loader_wait_ms"),
                                               "num_workers": ev.get("loader_workers")},
                   f"DataLoader(dataset, batch_size=..., num_workers={suggested_workers(ev.get('cores'))}{pin}, "
                   "persistent_workers=True)",
                   "05_data_overlap", f"the step waits {share:.0%} of its time for the next batch")


def small_batch(ev: dict[str, Any]) -> Finding | None:
    """A small batch leaves the GPU idle between kernels, with memory to spare for a bigger one."""
    b, headroom = ev.get("batch_size"), ev.get("memory_headroom")
    idle = _not_waiting_for_data(ev, _idle(ev, "host_launching") + _idle(ev, "queued"))
    if not b or b > SMALL_BATCH_MAX or idle < SMALL_BATCH_IDLE or (headroom is not None and
                                                                  headroom < SMALL_BATCH_HEADROOM):
        return None
    return Finding("small_batch", idle, {"batch_size": b, "idle": idle, "memory_headroom": headroom},
                   f"batch_size = {2 * b}  # or gl.find_max_batch_size(step_at) for the fastest that fits",
                   "06_batch_size", f"batch {b}: GPU idle {idle:.0%} of the step"
                   + (f", {headroom:.0%} of memory free" if headroom is not None else ""))


def fp32_matmul(ev: dict[str, Any]) -> Finding | None:
    """Matmuls and convolutions run in FP32, off the tensor cores."""
    share = _cls(ev, "matmul_fp32")
    if share < FP32_MATMUL:
        return None
    return Finding("fp32_matmul", share, {"matmul_fp32": share, "matmul_tc": _cls(ev, "matmul_tc")},
                   'with torch.autocast("cuda", torch.bfloat16): loss = loss_fn(model(x), y)',
                   "02_tensor_cores, 07_mixed_precision", f"{share:.0%} of the step in FP32 matmul kernels "
                   "(no tensor cores)")


def attention(ev: dict[str, Any]) -> Finding | None:
    """A hand-written softmax(QK^T)V where one fused SDPA kernel fits: its softmax, mask, scale and batched
    matmuls on the (t, t) score matrix."""
    share = _cls(ev, "softmax") + _cls(ev, "attention_manual")
    if share < ATTENTION or _cls(ev, "attention_fused") > 0:
        return None
    return Finding("attention", share, {"softmax": _cls(ev, "softmax"), "attention_path": _cls(ev, "attention_manual"),
                                        "attention_fused": 0.0},
                   "out = F.scaled_dot_product_attention(q, k, v, is_causal=True)", "07_mixed_precision",
                   f"{share:.0%} of the step on a hand-written attention's score matrix (softmax, mask, scale, "
                   "batched matmuls) and no fused attention kernel",
                   why="the attention is in your model's code: gpulab cannot rewrite it")


def layout(ev: dict[str, Any]) -> Finding | None:
    """Convolutions in NCHW: cuDNN converts to NHWC and back around its tensor-core kernels."""
    share = _cls(ev, "layout")
    if share < LAYOUT or ev.get("channels_last"):
        return None
    return Finding("layout", share, {"layout": share, "conv": ev.get("conv")},
                   "model = model.to(memory_format=torch.channels_last); x = x.to(memory_format=torch.channels_last)",
                   "07_mixed_precision, 09_profiling", f"{share:.0%} of the step converting NCHW <-> NHWC (the "
                   "conversions alone: NHWC convolutions also run faster, so the fix can gain more than this share)")


def optimizer(ev: dict[str, Any]) -> Finding | None:
    """An optimizer that loops over tensors in Python: one launch per tensor and operation."""
    opt = ev.get("optimizer") or {}
    share = float(opt.get("share") or 0.0)
    if not opt or opt.get("fused") or opt.get("foreach") or share < OPTIMIZER or \
            (opt.get("tensors") or 0) < OPTIMIZER_TENSORS:
        return None
    name = opt.get("class", "AdamW")
    return Finding("optimizer", share, {k: opt.get(k) for k in ("class", "foreach", "fused", "tensors", "share")},
                   f"opt = torch.optim.{name}(model.parameters(), ..., fused=True)  # or foreach=True",
                   "08_case_study", f"{name} steps {opt.get('tensors')} tensors one at a time: {share:.0%} of the step")


def elementwise(ev: dict[str, Any]) -> Finding | None:
    """Chains of elementwise kernels, each reading and writing memory: what a compiler fuses."""
    share = _cls(ev, "elementwise")
    if share < ELEMENTWISE:
        return None
    return Finding("elementwise", share, {"elementwise": share, "kernels_per_step": ev.get("kernels_per_step")},
                   "model = torch.compile(model)  # fuses chains of elementwise ops into one kernel",
                   "03_fusion", f"{share:.0%} of the step in elementwise and reduction kernels")


RULES: dict[str, Callable[[dict[str, Any]], Finding | None]] = {
    "launch_bound": launch_bound, "sync": sync, "data_wait": data_wait, "small_batch": small_batch,
    "fp32_matmul": fp32_matmul, "attention": attention, "layout": layout, "optimizer": optimizer,
    "elementwise": elementwise}


def what_bounds(ev: dict[str, Any]) -> str:
    """The healthy verdict's reason: the largest class of the step, and MFU where known."""
    classes = {k: v for k, v in (ev.get("classes") or {}).items() if v > 0}
    top = max(classes, key=classes.get) if classes else None
    mfu = ev.get("mfu")
    return ((f"{top} kernels take most of the step ({classes[top]:.0%})" if top else "no class dominates")
            + (f"; MFU {mfu:.0%}" if mfu is not None else "") + (f"; GPU busy {ev['busy']:.0%}"
                                                                  if ev.get("busy") is not None else ""))


def healthy(ev: dict[str, Any]) -> Finding:
    """The verdict when no rule passes its threshold: what bounds the step, and nothing invented (share 0: it
    explains no lost time)."""
    return Finding("healthy", 0.0, {"mfu": ev.get("mfu"), "busy": ev.get("busy"),
                                    "classes": dict(ev.get("classes") or {})}, "",
                   "09_profiling", "no rule passed its threshold: " + what_bounds(ev))


def findings(ev: dict[str, Any]) -> tuple[list[Finding], list[str]]:
    """Every rule's finding on the evidence (by share, or `healthy` alone), and the kinds a CPU run cannot judge."""
    gpu = bool(ev.get("gpu"))
    skipped = [] if gpu else [k for k in GPU_ONLY]
    found = [f for k, rule in RULES.items() if k not in skipped and (f := rule(ev)) is not None]
    found.sort(key=lambda f: -f.share)
    return (found or [healthy(ev)]), skipped
