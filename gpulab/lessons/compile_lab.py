"""torch.compile, measured: compile with a stopwatch (or a clear reason why not), count the kernels and bytes an
elementwise chain moves, capture a CUDA graph by hand, and time compile modes in a subprocess with a time cap.

    r = try_compile(gelu_tanh, x)              # CompileResult: .ok, .compile_s, .kernels, .reason; r(x) runs it
    t = eager_traffic(gelu_tanh, x)            # Traffic: ATen ops dispatched, bytes they read + wrote, fused ideal
    g = CUDAGraphed(lambda: model(idx))        # replay a captured graph: one launch for the whole forward
    m = time_mode_in_subprocess(spec, "max-autotune", timeout_s=90)   # killed cleanly past its budget

torch.compile needs a working backend: on a CPU a C++ compiler, on a CUDA GPU Triton (and a C compiler for its
launcher). Without one, `try_compile` returns a result with `ok=False` and the reason instead of raising.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from ..compiler import compiler_available
from ..device import synchronize
from ..workloads import GPT, GPTConfig, gelu_tanh
from ..dtypes import torch_dtype

MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
SUBPROCESS_MODES = ("eager", "cuda-graph") + MODES  # what time_mode_in_subprocess accepts
_RESULT_TAG = "GPULAB_MODE_RESULT "

__all__ = ["MODES", "SUBPROCESS_MODES", "add_relu_mul", "mul_sum", "sin_cos", "gelu_tanh", "compiler_available", "CompileResult",
           "try_compile", "Traffic", "eager_traffic", "CUDAGraphed", "gpt_forward_workload", "ModeTiming",
           "time_mode_in_subprocess"]


def add_relu_mul(x: torch.Tensor, bias: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """The guide's §3.1 example: three elementwise ops, one kernel each in eager mode."""
    return torch.relu(x + bias) * scale


def mul_sum(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """The guide's §3.3 reduction fusion: a product and a row sum, two kernels eager, one when fused."""
    return (a * b).sum(dim=-1)


def sin_cos(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The guide's §3.3 horizontal fusion: two ops on one input, two kernels eager, one (reading x once) fused."""
    return torch.sin(x), torch.cos(x)


# ---------------------------------------------------------------- which device a call runs on (compiler_available: gpulab.compiler)

def _device_of(args: tuple, device: torch.device | str | None) -> torch.device:
    if device is not None:
        return torch.device(device)
    for a in tree_flatten(args)[0]:
        if isinstance(a, torch.Tensor):
            return a.device
        if isinstance(a, torch.nn.Module):
            p = next(a.parameters(), None)
            if p is not None:
                return p.device
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


# ---------------------------------------------------------------- compile with a stopwatch

@dataclass
class CompileResult:
    """A compiled function (or why there is none), with what its first call cost."""

    mode: str
    ok: bool
    compile_s: float | None = None  # the first call: trace, lower, generate and compile kernels, run once
    kernels: int | None = None  # kernels inductor generated for this compile (None when not inductor)
    max_abs_err: float | None = None  # against the eager result on the example inputs
    reason: str = ""  # why it failed, or notes
    fn: Callable[..., Any] | None = field(default=None, repr=False, compare=False)

    def __bool__(self) -> bool:
        return self.ok

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if not self.ok or self.fn is None:
            raise RuntimeError(f"no compiled function ({self.mode}): {self.reason}")
        return self.fn(*args, **kwargs)

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if k != "fn"}

    def __repr__(self) -> str:
        if not self.ok:
            return f"CompileResult({self.mode}: not compiled - {self.reason})"
        k = "" if self.kernels is None else f", {self.kernels} kernel(s) generated"
        return f"CompileResult({self.mode}: first call {self.compile_s:.2f} s{k})"

    def _repr_html_(self) -> str:
        if not self.ok:
            return f"<b>torch.compile ({self.mode})</b>: <span style='color:#b42318'>not compiled</span> — {self.reason}"
        rows = [("first call (compile + one run)", f"{self.compile_s:.2f} s"),
                ("kernels generated", "n/a" if self.kernels is None else self.kernels),
                ("max |compiled − eager|", "n/a" if self.max_abs_err is None else f"{self.max_abs_err:.2e}")]
        body = "".join(f"<tr><td style='text-align:left'>{k}</td><td>{v}</td></tr>" for k, v in rows)
        return f"<b>torch.compile ({self.mode})</b>" + (f" <small>{self.reason}</small>" if self.reason else "") + \
            f"<table>{body}</table>"


def _why(e: BaseException) -> str:
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    return f"{type(e).__name__}: {' '.join(lines[:3])[:400]}" if lines else type(e).__name__


def _max_abs_err(a: Any, b: Any) -> float | None:
    fa = [t for t in tree_flatten(a)[0] if isinstance(t, torch.Tensor) and t.is_floating_point()]
    fb = [t for t in tree_flatten(b)[0] if isinstance(t, torch.Tensor) and t.is_floating_point()]
    if not fa or len(fa) != len(fb):
        return None
    return max(float((x.detach().float() - y.detach().float()).abs().max()) for x, y in zip(fa, fb))


def try_compile(fn: Callable[..., Any], *example_args: Any, mode: str = "default", backend: str = "inductor",
                options: dict[str, Any] | None = None, first_call: Callable[[Callable[..., Any]], Any] | None = None,
                use_cache: bool = False, check: bool = True, device: torch.device | str | None = None,
                **compile_kwargs: Any) -> CompileResult:
    """torch.compile `fn` and run it once, timing that first call: compiling is a cost of its own.

    Args:
        example_args: inputs for the first call (and for checking the result against eager).
        mode: a torch.compile mode ("default", "reduce-overhead", "max-autotune", ...); ignored with `options`.
        first_call: instead of `compiled(*example_args)`, run `first_call(compiled)` (e.g. forward + backward,
            so the backward graph is compiled inside the timed call too); then there is no eager check.
        use_cache: False turns inductor's FX-graph and autotuning caches off for this compile, so the time is
            the compile's own work and the kernel count is real (a cache hit generates nothing). Compiled kernel
            binaries (Triton, C++) may still come from the on-disk cache of an earlier run.
    Returns a CompileResult: `ok=False` with the reason when there is no working compiler or compiling fails.
    """
    if backend == "inductor" and options is None and mode not in MODES:
        raise ValueError(f"mode={mode!r} is not supported; allowed: {', '.join(MODES)}")
    if not callable(fn):
        raise ValueError("fn must be callable")
    label = mode if backend == "inductor" and options is None else (backend if options is None else "custom options")
    dev = _device_of((fn,) + example_args, device)
    if backend == "inductor":
        ok, why = compiler_available(dev)
        if not ok:
            return CompileResult(label, False, reason=why)
    try:
        kw = dict(backend=backend, **compile_kwargs)
        if backend == "inductor":
            kw.update(options=options) if options is not None else kw.update(mode=mode)
        compiled = torch.compile(fn, **kw)
    except Exception as e:
        return CompileResult(label, False, reason=_why(e))
    patches: dict[str, Any] = {}
    metrics = None
    if backend == "inductor":
        from torch._inductor import config as inductor_config
        from torch._inductor import metrics
        if not use_cache:
            patches = {"fx_graph_cache": False, "autotune_local_cache": False}
        metrics.reset()
        ctx = inductor_config.patch(patches)
    else:
        import contextlib
        ctx = contextlib.nullcontext()
    try:
        with ctx:
            synchronize(dev)
            t0 = time.perf_counter()
            out = first_call(compiled) if first_call is not None else compiled(*example_args)
            synchronize(dev)
            compile_s = time.perf_counter() - t0
    except Exception as e:  # no compiler, a compiler error, an unsupported op...: say so, do not crash
        return CompileResult(label, False, reason=_why(e))
    kernels = metrics.generated_kernel_count if metrics is not None else None
    err = None
    if check and first_call is None:
        with torch.no_grad():
            err = _max_abs_err(out, fn(*example_args))
    note = "" if use_cache else "FX-graph cache off for this compile"
    return CompileResult(label, True, compile_s=compile_s, kernels=kernels, max_abs_err=err, reason=note,
                         fn=compiled)


# ---------------------------------------------------------------- bytes moved by an eager chain

def _nbytes(t: torch.Tensor) -> int:
    """Bytes of the distinct elements a tensor addresses (a broadcast dimension, stride 0, counts once)."""
    n = 1
    for size, stride in zip(t.shape, t.stride()):
        if stride != 0:
            n *= size
    return n * t.element_size()


@dataclass
class Traffic:
    """What an eager function does to memory: each ATen op it dispatched and the bytes it read plus wrote.

    In eager mode every op is (at least) one kernel that reads its inputs from memory and writes its output
    back; a fused kernel reads the function's inputs once and writes its outputs once (`ideal_bytes`).
    """

    ops: list[tuple[str, int]]  # (op name, bytes read + written), in call order; views are not counted
    ideal_bytes: int  # the function's distinct inputs read once + its outputs written once

    @property
    def n_ops(self) -> int:
        return len(self.ops)

    @property
    def total_bytes(self) -> int:
        return sum(b for _, b in self.ops)

    @property
    def ratio(self) -> float:
        """Eager bytes over fused-ideal bytes: how many times more memory traffic the unfused chain makes."""
        return self.total_bytes / self.ideal_bytes if self.ideal_bytes else float("nan")

    def to_dict(self) -> dict[str, Any]:
        return {"ops": [list(o) for o in self.ops], "ideal_bytes": self.ideal_bytes, "n_ops": self.n_ops,
                "total_bytes": self.total_bytes, "ratio": self.ratio}

    def __repr__(self) -> str:
        return (f"Traffic({self.n_ops} ops, {self.total_bytes / 1e6:,.1f} MB eager vs "
                f"{self.ideal_bytes / 1e6:,.1f} MB fused ideal: {self.ratio:.2f}x)")

    def _repr_html_(self) -> str:
        rows = "".join(f"<tr><td>{i + 1}</td><td style='text-align:left'>aten.{n}</td><td>{b / 1e6:,.1f} MB</td></tr>"
                       for i, (n, b) in enumerate(self.ops))
        return (f"<table><tr><th>#</th><th>op (one kernel each, eager)</th><th>read + written</th></tr>{rows}"
                f"<tr><td></td><td style='text-align:left'><b>eager total</b></td><td><b>{self.total_bytes / 1e6:,.1f} MB"
                f"</b></td></tr><tr><td></td><td style='text-align:left'>one fused kernel (inputs once, output once)"
                f"</td><td>{self.ideal_bytes / 1e6:,.1f} MB</td></tr></table>"
                f"<p>{self.ratio:.2f}x more memory traffic unfused</p>")


class _TrafficMode(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops: list[tuple[str, int]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if not getattr(func, "is_view", False):
            ins = [t for t in tree_flatten((args, kwargs or {}))[0] if isinstance(t, torch.Tensor)]
            outs = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
            nbytes = sum(_nbytes(t) for t in ins + outs)
            if nbytes:
                self.ops.append((func.overloadpacket.__name__, nbytes))
        return out


def eager_traffic(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Traffic:
    """Run `fn(*args, **kwargs)` eagerly once and count the ops it dispatches and the bytes each moves."""
    if not callable(fn):
        raise ValueError("fn must be callable")
    with torch.no_grad(), _TrafficMode() as mode:
        out = fn(*args, **kwargs)
    seen: dict[int, int] = {}
    for t in tree_flatten((args, kwargs))[0] + tree_flatten(out)[0]:
        if isinstance(t, torch.Tensor):
            seen.setdefault(t.data_ptr(), _nbytes(t))
    return Traffic(ops=mode.ops, ideal_bytes=sum(seen.values()))


# ---------------------------------------------------------------- CUDA graphs by hand

class CUDAGraphed:
    """`fn()` captured once into a CUDA graph; calling replays the whole graph with one launch.

    `fn` must be free of CPU-GPU syncs and always read the same input tensors (change their contents in place
    to feed new data); every replay writes into the same output tensors (`self.output`).
    """

    def __init__(self, fn: Callable[[], Any], warmup: int = 3):
        if not torch.cuda.is_available():
            raise RuntimeError("CUDA graphs need a CUDA GPU")
        if warmup < 1:
            raise ValueError(f"warmup={warmup} must be >= 1 (cuBLAS and allocator set-up must not be captured)")
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm up on a side stream, as torch.cuda.graph's docs ask
            for _ in range(warmup):
                fn()
        torch.cuda.current_stream().wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.output = fn()
        torch.cuda.synchronize()

    def __call__(self) -> Any:
        self.graph.replay()
        return self.output


# ---------------------------------------------------------------- compile modes, each in its own process

def gpt_forward_workload(config: dict[str, Any], batch: int, seq: int, dtype: str = "bf16",
                         device: str | None = None, seed: int = 0) -> tuple[GPT, torch.Tensor]:
    """A GPT in eval mode (weights in `dtype`) and random token ids (batch, seq): an inference forward pass."""
    dtypes = {k: torch_dtype(k) for k in ("bf16", "fp16", "fp32")}
    if dtype not in dtypes:
        raise ValueError(f"dtype={dtype!r}; allowed: {', '.join(dtypes)}")
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    torch.manual_seed(seed)
    cfg = GPTConfig(**config)
    if seq > cfg.block_size:
        raise ValueError(f"seq={seq} exceeds block_size={cfg.block_size}")
    model = GPT(cfg).to(dev, dtypes[dtype]).eval()
    idx = torch.randint(0, cfg.vocab_size, (batch, seq), device=dev)
    return model, idx


@dataclass
class ModeTiming:
    """One compile mode of one workload, timed in its own process."""

    mode: str
    ok: bool
    compile_s: float | None = None  # first call, compile included (None for eager)
    median_s: float | None = None  # steady-state time per call
    iqr_s: float | None = None
    q1_s: float | None = None  # quartiles of the time per call (the interval of a ratio between modes)
    q3_s: float | None = None
    kernels_per_call: float | None = None  # from the profiler trace (CUDA)
    busy_fraction: float | None = None  # GPU busy over wall time, from the trace (CUDA)
    max_abs_err: float | None = None
    wall_s: float | None = None  # the whole subprocess: start-up, build, compile, timing
    reason: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ModeTiming:
        return cls(**{k: v for k, v in d.items() if k in cls.__dataclass_fields__})


def _run_mode(spec: dict[str, Any]) -> ModeTiming:
    """Inside the child: build the workload, compile it in `mode`, time it (and profile it on CUDA)."""
    from ..profiling import profile
    from ..timing import benchmark

    mode = spec["mode"]
    model, idx = gpt_forward_workload(**spec["workload"])
    dev = idx.device
    compile_s = err = None
    with torch.no_grad():
        if mode == "eager":
            def fn():
                return model(idx)
        elif mode == "cuda-graph":
            if dev.type != "cuda":
                return ModeTiming(mode, False, reason="CUDA graphs need a CUDA GPU")
            t0 = time.perf_counter()
            fn = CUDAGraphed(lambda: model(idx))
            compile_s = time.perf_counter() - t0
            err = _max_abs_err(fn(), model(idx))
        else:
            r = try_compile(model, idx, mode=mode, use_cache=spec.get("use_cache", False))
            if not r.ok:
                return ModeTiming(mode, False, reason=r.reason)
            compile_s, err = r.compile_s, r.max_abs_err

            def fn():
                return r.fn(idx)
        m = benchmark(fn, min_time_s=spec.get("min_time_s", 0.5), device=dev)
        kernels = busy = None
        note = ""
        if dev.type == "cuda" and spec.get("profile", True):
            try:
                p = profile(fn, steps=3, warmup=1)
                kernels, busy = p.kernels_per_step, p.busy_fraction
            except Exception as e:  # the timing stands without the trace
                note = f"profiler failed: {_why(e)}"
    return ModeTiming(mode, True, compile_s=compile_s, median_s=m.median, iqr_s=m.iqr, q1_s=m.q1, q3_s=m.q3,
                      kernels_per_call=kernels,
                      busy_fraction=busy, max_abs_err=err, reason=note)


def _kill(p: subprocess.Popen) -> None:
    """Stop the child and the compile workers it started (its own process group on POSIX)."""
    try:
        if os.name == "posix":
            os.killpg(p.pid, signal.SIGKILL)
        else:
            p.kill()
    except (ProcessLookupError, PermissionError):
        pass


def time_mode_in_subprocess(workload: dict[str, Any], mode: str, *, timeout_s: float, min_time_s: float = 0.5,
                            use_cache: bool = False, profile: bool = True) -> ModeTiming:
    """Compile and time `gpt_forward_workload(**workload)` in `mode` in a fresh Python process.

    A fresh process gives each mode a clean compiler state, and `timeout_s` is a hard cap: past it the process
    (with its compile workers) is killed and the result says so. The parent should be idle meanwhile.
    modes: "eager", "cuda-graph" (manual capture, no compiler) or a torch.compile mode.
    """
    if mode not in SUBPROCESS_MODES:
        raise ValueError(f"mode={mode!r}; allowed: {', '.join(SUBPROCESS_MODES)}")
    if timeout_s <= 0:
        raise ValueError(f"timeout_s={timeout_s} must be > 0")
    spec = {"workload": workload, "mode": mode, "min_time_s": min_time_s, "use_cache": use_cache,
            "profile": profile}
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parents[2])  # so the child imports this gpulab, installed or not
    env["PYTHONPATH"] = os.pathsep.join([root] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    cmd = [sys.executable, "-m", "gpulab.lessons.compile_lab", json.dumps(spec)]
    t0 = time.perf_counter()
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                         start_new_session=os.name == "posix")
    try:
        out, err = p.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        _kill(p)
        p.communicate()
        return ModeTiming(mode, False, wall_s=time.perf_counter() - t0,
                          reason=f"stopped at its {timeout_s:.0f} s budget (start-up, compile and timing together)")
    wall = time.perf_counter() - t0
    lines = [ln for ln in out.splitlines() if ln.startswith(_RESULT_TAG)]
    if not lines:
        tail = " ".join((err or out).strip().splitlines()[-3:])[-400:]
        return ModeTiming(mode, False, wall_s=wall, reason=f"the subprocess exited with code {p.returncode}: {tail}")
    res = ModeTiming.from_dict(json.loads(lines[-1][len(_RESULT_TAG):]))
    res.wall_s = wall
    return res


def _main(argv: list[str]) -> int:
    spec = json.loads(argv[0])
    try:
        res = _run_mode(spec)
    except Exception as e:  # report, do not die with a traceback the parent cannot read
        res = ModeTiming(spec.get("mode", "?"), False, reason=_why(e))
    print(_RESULT_TAG + json.dumps(res.to_dict()), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
