"""A profiler trace's time per step by kernel class: FP32 or tensor-core matmuls, attention, layout conversions,
elementwise chains, optimizer, a hand-written attention's path; the host's time blocked in syncs. Pure functions over
the trace's events, so recorded traces test them.

On a GPU the classes come from the device kernels' names; on a CPU from the `aten::` ops' own time (less the ops
they call), since a CPU trace has no kernels.
"""
from __future__ import annotations

import re
from collections import defaultdict
from typing import Any

STEP_RANGE = "gpulab_step"
OPTIMIZER_PREFIX = "Optimizer.step#"  # torch.optim wraps every step() in a range of this name

# Kernel-name fragments (lower case) of each class, checked in this order: the first class that matches wins.
GPU_CLASSES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("optimizer", ("multi_tensor_apply", "fused_adam", "fusedadam", "fused_sgd", "_fused_")),
    ("attention_fused", ("flash", "fmha", "efficient_attention", "sdpa", "attention")),
    ("softmax", ("softmax",)),
    ("layout", ("nchwtonhwc", "nhwctonchw", "nchw_to_nhwc", "nhwc_to_nchw")),
    ("matmul", ("gemm", "conv", "wgrad", "dgrad", "fprop", "cutlass", "xmma", "cublas", "winograd", "implicit",
                "nvjet")),
    ("elementwise", ("elementwise", "vectorized", "unrolled", "reduce_kernel", "triton_poi", "triton_red")),
)
# A matmul or convolution kernel on tensor cores names its input type; an FP32 one (sgemm, f32f32...) does not.
# cuBLAS's Hopper kernels (nvjet_*) run on tensor cores only.
TENSOR_CORE_TAGS = ("nvjet", "tf32", "bf16", "f16", "fp16", "h1688", "h16816", "s1688", "s16816", "884", "e4m3", "e5m2",
                    "i8", "half", "bfloat", "hmma", "wgmma")
# softmax_warp_forward<in, out, acc, log2_elements, is_log_softmax, is_masked>: a log-softmax is a loss, not attention
LOG_SOFTMAX_WARP = re.compile(r"softmax_warp_\w+<[^>]*?,\s*\d+,\s*true\b")
CPU_CLASSES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("attention_fused", ("scaled_dot_product", "flash_attention")),
    ("softmax", ("softmax",)),
    ("matmul", ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "convolution", "conv2d", "conv1d")),
    ("elementwise", ("aten::add", "aten::mul", "aten::sub", "aten::div", "aten::gelu", "aten::relu", "aten::threshold",
                     "aten::sigmoid", "aten::tanh", "aten::exp", "aten::pow", "aten::sqrt", "aten::addc",
                     "aten::lerp", "aten::copy_", "aten::fill_", "aten::zero_", "aten::neg", "aten::rsqrt")),
)


def kernel_class(name: str) -> str:
    """The class of a GPU kernel from its name; matmuls split into "matmul_tc" and "matmul_fp32"."""
    low = name.lower()
    if "logsoftmax" in low or "log_softmax" in low or LOG_SOFTMAX_WARP.search(low):  # a cross-entropy loss
        return "other"
    for cls, frags in GPU_CLASSES:
        if any(f in low for f in frags):
            if cls == "matmul":
                if "convert" in low:  # a dtype or format conversion, not a convolution
                    continue
                return "matmul_tc" if any(t in low for t in TENSOR_CORE_TAGS) else "matmul_fp32"
            return cls
    return "other"


def cpu_op_class(name: str) -> str:
    """The class of an aten op in a CPU trace (no tensor cores there: matmuls are just "matmul")."""
    low = name.lower()
    if "log_softmax" in low:  # a cross-entropy loss, not attention
        return "other"
    for cls, frags in CPU_CLASSES:
        if any(f in low for f in frags):
            return cls
    return "other"


# A hand-written attention's ops on the score matrix: softmax(mask(scale * Q @ K^T)) @ V and their backward.
ATTENTION_OPS = ("aten::bmm", "aten::baddbmm", "aten::masked_fill", "aten::_softmax", "aten::softmax",
                 "aten::_softmax_backward_data")


def _score_matrix(dims: Any) -> bool:
    """Whether an op's first input is a (batch, heads, t, t) score matrix: 4-D with its last two sizes equal."""
    first = dims[0] if isinstance(dims, list) and dims else None
    return isinstance(first, list) and len(first) == 4 and first[-1] == first[-2] and first[-1] >= 16


def _launching_ops(events: list[dict[str, Any]]) -> dict[Any, dict[str, Any]]:
    """Each kernel launch's correlation id -> the innermost aten op that made it (same thread, its span)."""
    import bisect

    ops: dict[Any, list[dict[str, Any]]] = defaultdict(list)
    for e in events:
        if e.get("cat") == "cpu_op":
            ops[e.get("tid")].append(e)
    starts = {}
    for tid, evs in ops.items():
        evs.sort(key=lambda e: float(e["ts"]))
        starts[tid] = [float(e["ts"]) for e in evs]
    out = {}
    for e in events:
        corr = e.get("args", {}).get("correlation")
        if e.get("cat") not in ("cuda_runtime", "cuda_driver") or corr is None or e.get("tid") not in ops:
            continue
        t, evs = float(e["ts"]), ops[e.get("tid")]
        last = bisect.bisect_right(starts[e.get("tid")], t) - 1
        for i in range(last, max(-1, last - 200), -1):  # a launch outside every op need not scan them all
            if _span(evs[i])[1] >= t:  # the latest-starting op that still spans the launch is the innermost
                out[corr] = evs[i]
                break
    return out


def attention_path(kernels: list[dict[str, Any]], events: list[dict[str, Any]]) -> set[int]:
    """Indices of the kernels on a hand-written attention's path (its ops by name, or any op on a (b, h, t, t)
    score matrix): only where the step has softmax kernels and no fused attention kernel."""
    names = [kernel_class(str(k.get("name", ""))) for k in kernels]
    if "softmax" not in names or "attention_fused" in names:
        return set()
    launched_by = _launching_ops(events)
    out = set()
    for i, k in enumerate(kernels):
        op = launched_by.get(k.get("args", {}).get("correlation"))
        if op is not None and (str(op.get("name")) in ATTENTION_OPS or
                               _score_matrix(op.get("args", {}).get("Input Dims"))):
            out.add(i)
    return out


def sync_wait_ms(events: list[dict[str, Any]], steps: list[tuple[float, float]]) -> float:
    """The host's time inside synchronizing calls during the steps (ms, all steps together)."""
    from ...measuring.profiling import SYNC_CALLS

    return sum(float(e["dur"]) for e in events if e.get("name") in SYNC_CALLS
               and e.get("cat") in ("cuda_runtime", "cuda_driver") and (not steps or _inside(float(e["ts"]), steps))
               ) / 1e3


def _span(e: dict[str, Any]) -> tuple[float, float]:
    return float(e["ts"]), float(e["ts"]) + float(e["dur"])


def _inside(t: float, spans: list[tuple[float, float]]) -> bool:
    return any(a <= t <= b for a, b in spans)


def _self_ms(ops: list[dict[str, Any]]) -> list[tuple[str, float]]:
    """Each op's own time in ms: its duration less its direct children's (ops nest per thread)."""
    by_tid: dict[Any, list[dict[str, Any]]] = defaultdict(list)
    for e in ops:
        by_tid[e.get("tid")].append(e)
    out = []
    for evs in by_tid.values():
        evs.sort(key=lambda e: (float(e["ts"]), -float(e["dur"])))
        own = [float(e["dur"]) for e in evs]
        stack: list[int] = []
        for i, e in enumerate(evs):
            s, _ = _span(e)
            while stack and _span(evs[stack[-1]])[1] <= s:
                stack.pop()
            if stack:
                own[stack[-1]] -= float(e["dur"])
            stack.append(i)
        out += [(str(e.get("name", "")), max(0.0, t) / 1e3) for e, t in zip(evs, own)]
    return out


def step_classes(trace: dict[str, Any]) -> dict[str, Any]:
    """Per-step milliseconds of each class, the step's profiled ms, the optimizer range's ms and whether the
    classes came from GPU kernels; shares are ms over step_ms."""
    events = [e for e in trace.get("traceEvents", []) if e.get("ph") == "X" and "dur" in e]
    steps = [_span(e) for e in events if e.get("name") == STEP_RANGE and e.get("cat") == "user_annotation"]
    n = max(1, len(steps))
    step_ms = sum(b - a for a, b in steps) / 1e3 / n if steps else 0.0
    optim = [_span(e) for e in events if str(e.get("name", "")).startswith(OPTIMIZER_PREFIX)
             and e.get("cat") in ("user_annotation", "cpu_op") and (not steps or _inside(_span(e)[0], steps))]
    kernels = [e for e in events if e.get("cat") == "kernel"]
    ms: dict[str, float] = defaultdict(float)
    if kernels:
        optim_corr = {e.get("args", {}).get("correlation") for e in events
                      if e.get("cat") in ("cuda_runtime", "cuda_driver") and _inside(float(e["ts"]), optim)}
        manual = attention_path(kernels, events)
        for i, k in enumerate(kernels):
            cls = kernel_class(str(k.get("name", "")))
            if cls in ("elementwise", "other") and k.get("args", {}).get("correlation") in optim_corr:
                cls = "optimizer"  # a foreach-less optimizer's per-tensor kernels are elementwise by name
            elif i in manual:
                cls = "attention_manual"  # softmax, mask, scale and the batched matmuls on the score matrix
            ms[cls] += float(k["dur"]) / 1e3
        window = [(min(a for a, _ in steps), max(b for _, b in steps))] if steps else []
        device_end = max(_span(k)[1] for k in kernels)
        if steps and device_end > window[0][1]:  # the GPU finishes after the host's last step range closes
            step_ms = (device_end - window[0][0]) / 1e3 / n
    else:
        ops = [e for e in events if e.get("cat") == "cpu_op" and (not steps or _inside(float(e["ts"]), steps))]
        for name, own in _self_ms(ops):
            ms[cpu_op_class(name)] += own
    per_step = {k: v / n for k, v in ms.items()}
    optimizer_ms = sum(b - a for a, b in optim) / 1e3 / n
    return {"gpu": bool(kernels), "steps": len(steps), "step_ms": step_ms, "class_ms": per_step,
            "optimizer_range_ms": optimizer_ms, "sync_wait_ms": sync_wait_ms(events, steps) / n if kernels else 0.0,
            "kernels_per_step": len(kernels) / n if kernels else None}


def shares(classes: dict[str, Any]) -> dict[str, float]:
    """Each class's share of the profiled step (0 to 1)."""
    step = classes.get("step_ms") or 0.0
    return {k: (v / step if step > 0 else 0.0) for k, v in classes.get("class_ms", {}).items()}
