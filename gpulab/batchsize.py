"""Batch size: find the largest one that fits (and the fastest), time a GPT step at any size, check gradient
accumulation is exact, and read the sweep the way the guide does (its sweet spot, 80% of the maximum).

    step = GPTTrainStep(GPTConfig.gpt2_small(), seq_len=1024, device=dev, amp_dtype=torch.bfloat16)
    step(64)                      # one optimizer step on 64 sequences
    step(64, accum=4)             # the same 64 sequences as 4 micro-batches of 16, one optimizer step
    rows, runs = batch_sweep(step, [1, 2, 4, 8, 16, 32, 64])     # throughput, MFU, utilization, peak memory

The step draws random token ids on the device (never zeros): there is no loader and no queue, so a step's
throughput is items over its median time.
"""
from __future__ import annotations

import copy
import html
import statistics
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Sequence

import torch

from tqdm.auto import tqdm

from .claims import Estimate, difference, median_interval  # noqa: F401  (difference: used by notebook 06)
from .dataloading import _check_int
from .device import as_torch_device, get_device, synchronize
from . import checks
from .experiment import RunResult, default_min_time, measure
from .memory import is_oom  # noqa: F401 (one home; still importable from here)
from .memory import release as _release
from .flops import transformer_flops_per_token
from .text import si
from .timing import ROUND, benchmark
from .workloads import GPT, GPTConfig




class SimulatedOutOfMemory(RuntimeError):
    """Raised when a batch would need more memory than a simulated limit (memory_limit_bytes)."""


ROW_KEYS = ("batch_size", "fits", "samples_per_s", "step_ms", "peak_mem_bytes", "error")


@dataclass
class BatchSizeSearch:
    """Every batch size tried (fits or not, speed, peak memory), the largest that fits and the fastest."""

    max_fitting: int | None
    best_throughput: int | None
    tried: list[dict[str, Any]] = field(default_factory=list)
    memory_allocated_before: int | None = None
    memory_allocated_after: int | None = None
    memory_allocated_between_steps: int | None = None
    memory_limit_bytes: int | None = None
    device: str = "cpu"

    @property
    def memory_recovered(self) -> bool | None:
        """Whether allocated GPU memory is back to its level between training steps (None off CUDA).

        The level is taken after the first step that fit, not before the search: that step legitimately
        creates state that stays (optimizer moments, gradients, the cuBLAS workspace).
        """
        baseline = self.memory_allocated_between_steps
        baseline = self.memory_allocated_before if baseline is None else baseline
        if baseline is None or self.memory_allocated_after is None:
            return None
        return self.memory_allocated_after <= baseline

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict with every batch size tried."""
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> BatchSizeSearch:
        """A BatchSizeSearch from `to_dict`'s dict."""
        return cls(**{k: d[k] for k in cls.__dataclass_fields__ if k in d})

    def __repr__(self) -> str:
        return (f"BatchSizeSearch(max_fitting={self.max_fitting}, best_throughput={self.best_throughput}, "
                f"tried={[r['batch_size'] for r in self.tried]}, device={self.device!r})")

    def _repr_html_(self) -> str:
        head = "".join(f"<th>{_HEADS.get(k, k.replace('_', ' '))}</th>" for k in ROW_KEYS)
        body = ""
        for r in sorted(self.tried, key=lambda r: r["batch_size"]):
            style = " style='background:#dcfce7;font-weight:bold'" if r["batch_size"] == self.best_throughput else ""
            style = " style='color:#b42318'" if not r["fits"] else style
            body += f"<tr{style}>" + "".join(f"<td>{_fmt(k, r.get(k))}</td>" for k in ROW_KEYS) + "</tr>"
        limit = (f"; simulated memory limit {self.memory_limit_bytes / 2**20:.1f} MiB"
                 if self.memory_limit_bytes else "")
        mem = {True: "allocated memory back to its between-steps level",
               False: "allocated memory NOT back to its between-steps level (something holds tensors)",
               None: "memory not tracked (no CUDA)"}[self.memory_recovered]
        return (f"<div><b>Batch size search</b> on {self.device}{limit}: largest that fits "
                f"<b>{self.max_fitting}</b>, fastest <b>{self.best_throughput}</b> (highlighted); {mem}"
                f"<table><tr>{head}</tr>{body}</table></div>")


_HEADS = {"batch_size": "batch size", "samples_per_s": "samples/s", "step_ms": "step", "peak_mem_bytes": "peak memory"}


def _fmt(key: str, v: Any) -> str:
    """A table cell: three significant figures with SI prefixes; memory in GB as on the rest of the page."""
    if v is None:
        return "—"
    if key == "peak_mem_bytes":
        return si(v, "B")
    if key == "step_ms" and isinstance(v, (int, float)):
        return si(v / 1e3, "s")
    return si(v) if isinstance(v, float) else html.escape(str(v))


CPU_ALLOCATION_FAILURES = ("can't allocate", "cannot allocate", "defaultcpuallocator", "not enough memory")


def is_allocation_failure(exc: BaseException) -> bool:
    """Out of memory on any device: CUDA's OutOfMemoryError, a RuntimeError saying "out of memory", a CPU
    allocator's failure ("DefaultCPUAllocator: can't allocate memory") or Python's MemoryError."""
    if isinstance(exc, MemoryError) or is_oom(exc):
        return True
    return isinstance(exc, RuntimeError) and any(s in str(exc).lower() for s in CPU_ALLOCATION_FAILURES)


def find_max_batch_size(step_fn: Callable[[int], Any], *, start: int = 1, max_batch: int = 4096,
                        device: Any = None, memory_limit_bytes: int | None = None,
                        memory_fn: Callable[[int], int] | None = None, measure_throughput: bool = True,
                        timed_steps: int = 3, progress: bool = True) -> BatchSizeSearch:
    """Double the batch size from `start` until a step runs out of memory (or reaches `max_batch`), then bisect.

    `step_fn(batch_size)` runs one full training step (forward, backward, optimizer) at that batch size and
    should drop its own references when it returns (zero_grad(set_to_none=True) at its start helps).
    Out-of-memory is `torch.OutOfMemoryError`, a RuntimeError saying "out of memory", a CPU allocator's
    failure ("can't allocate memory") or a MemoryError (`is_allocation_failure`). `max_batch` caps the search
    (4096 by default: raise it for a small model on a big GPU; on a CPU a big batch may swap before it fails). To simulate a smaller
    device, pass `memory_limit_bytes`: a batch then fails when `memory_fn(batch_size)` exceeds it, or, on CUDA
    without `memory_fn`, when the step's measured peak allocation does. Each batch that fits is timed
    (1 warm-up step, then the median of `timed_steps`, synchronized on CUDA).
    """
    for name, v, lo in (("start", start, 1), ("max_batch", max_batch, 1), ("timed_steps", timed_steps, 1)):
        if not isinstance(v, int) or isinstance(v, bool) or v < lo:
            raise ValueError(f"{name}={v!r} must be an integer >= {lo}")
    if start > max_batch:
        raise ValueError(f"start={start} must not exceed max_batch={max_batch}")
    if memory_limit_bytes is not None and memory_limit_bytes <= 0:
        raise ValueError(f"memory_limit_bytes={memory_limit_bytes!r} must be positive")
    if not callable(step_fn):
        raise ValueError("step_fn must be callable as step_fn(batch_size)")
    dev = as_torch_device(device)
    cuda = dev.type == "cuda"
    if memory_fn is not None and memory_limit_bytes is None:
        raise ValueError("memory_fn needs memory_limit_bytes (the simulated limit it is compared with)")
    if memory_limit_bytes is not None and memory_fn is None and not cuda:
        raise ValueError("memory_limit_bytes needs memory_fn off CUDA (there is no allocator to measure)")

    _release(dev)
    before = torch.cuda.memory_allocated(dev) if cuda else None
    tried: list[dict[str, Any]] = []
    state: dict[str, int | None] = {"between_steps": None}
    bar = tqdm(desc="batch size search", unit="try", disable=not progress)

    def run_step(b: int) -> None:
        if memory_limit_bytes is not None and memory_fn is not None and memory_fn(b) > memory_limit_bytes:
            raise SimulatedOutOfMemory(f"simulated out of memory: batch {b} needs {memory_fn(b)} bytes "
                                       f"> limit {memory_limit_bytes}")
        step_fn(b)
        synchronize(dev)
        if memory_limit_bytes is not None and memory_fn is None:  # CUDA: compare the real peak to the limit
            peak = torch.cuda.max_memory_allocated(dev)
            if peak > memory_limit_bytes:
                raise SimulatedOutOfMemory(f"simulated out of memory: batch {b} peaked at {peak} bytes "
                                           f"> limit {memory_limit_bytes}")

    def attempt(b: int) -> bool:
        row = dict(batch_size=b, fits=False, samples_per_s=None, step_ms=None, peak_mem_bytes=None, error=None)
        if cuda:
            torch.cuda.reset_peak_memory_stats(dev)
        try:
            run_step(b)  # the first step is also the warm-up
            if measure_throughput:
                times = []
                for _ in range(timed_steps):
                    synchronize(dev)
                    t0 = time.perf_counter()
                    run_step(b)
                    times.append(time.perf_counter() - t0)
                step_s = statistics.median(times)
                row.update(step_ms=step_s * 1e3, samples_per_s=b / step_s)
            row["fits"] = True
            if cuda:
                row["peak_mem_bytes"] = torch.cuda.max_memory_allocated(dev)
                if state["between_steps"] is None:
                    state["between_steps"] = torch.cuda.memory_allocated(dev)
        except (RuntimeError, MemoryError) as e:
            if not is_allocation_failure(e):
                raise
            row["error"] = f"{type(e).__name__}: {(str(e).splitlines() or [''])[0][:160]}"  # a string, not the exception
        if not row["fits"]:
            # Out of the except block now: the traceback (and the tensors its frames held) can be freed.
            _release(dev)
        tried.append(row)
        bar.update(1)
        bar.set_postfix(batch=b, fits=row["fits"])
        return row["fits"]

    try:
        good, bad, b = 0, None, start
        while True:  # doubling phase
            if attempt(b):
                good = b
                if b >= max_batch:
                    break
                b = min(2 * b, max_batch)
            else:
                bad = b
                break
        while bad is not None and bad - good > 1:  # bisection between the last fit and the first failure
            mid = (good + bad) // 2
            if attempt(mid):
                good = mid
            else:
                bad = mid
    finally:
        bar.close()
    _release(dev)
    after = torch.cuda.memory_allocated(dev) if cuda else None
    fitting = [r for r in tried if r["fits"] and r["samples_per_s"] is not None]
    best = max(fitting, key=lambda r: r["samples_per_s"])["batch_size"] if fitting else None
    return BatchSizeSearch(max_fitting=good or None, best_throughput=best, tried=tried,
                           memory_allocated_before=before, memory_allocated_after=after,
                           memory_allocated_between_steps=state["between_steps"],
                           memory_limit_bytes=memory_limit_bytes, device=str(dev))


def grad_accumulation_matches(model_fn: Callable[[], torch.nn.Module], x: torch.Tensor, y: torch.Tensor,
                              loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], micro_batches: int,
                              *, dtype: torch.dtype | None = None, seed: int = 0, rtol: float = 1e-4
                              ) -> dict[str, Any]:
    """Gradients of one big batch vs `micro_batches` accumulated micro-batches (each loss / k): how close?

    Exact in real arithmetic for a mean loss without batch-coupled layers; BatchNorm (per-batch statistics)
    and dropout (different random masks) make them differ. `dtype=torch.float64` shows the float32
    difference is rounding. Returns max_abs_diff, rel_diff (L2 norm of the difference over that of the
    big-batch gradient) and matches (rel_diff <= rtol).
    """
    if not isinstance(micro_batches, int) or micro_batches < 1:
        raise ValueError(f"micro_batches={micro_batches!r} must be a positive integer")
    if len(x) % micro_batches:
        raise ValueError(f"micro_batches={micro_batches} must divide the batch size {len(x)}")
    torch.manual_seed(seed)
    big = model_fn()
    torch.manual_seed(seed)
    acc = model_fn()
    acc.load_state_dict(copy.deepcopy(big.state_dict()))  # identical even if model_fn is not seed-deterministic
    if dtype is not None:
        big, acc = big.to(dtype), acc.to(dtype)
        x = x.to(dtype) if x.is_floating_point() else x
    big, acc = big.to(x.device), acc.to(x.device)

    loss_fn(big(x), y).backward()
    for xs, ys in zip(x.chunk(micro_batches), y.chunk(micro_batches)):
        (loss_fn(acc(xs), ys) / micro_batches).backward()  # a mean loss: each micro-batch counts 1/k

    diffs, ref = [], []
    for p, q in zip(big.parameters(), acc.parameters()):
        if p.grad is None:
            continue
        diffs.append((p.grad - q.grad).double().flatten())
        ref.append(p.grad.double().flatten())
    diff, ref_all = torch.cat(diffs), torch.cat(ref)
    rel = (diff.norm() / ref_all.norm().clamp_min(1e-300)).item()
    return {"micro_batches": micro_batches, "batch_size": len(x), "micro_batch_size": len(x) // micro_batches,
            "dtype": str(next(big.parameters()).dtype).removeprefix("torch."),
            "max_abs_diff": diff.abs().max().item(), "max_abs_grad": ref_all.abs().max().item(),
            "rel_diff": rel, "matches": rel <= rtol}


# ---------------------------------------------------------------- a GPT step at any batch size

class GPTTrainStep:
    """One GPT training step at any batch size: `step(b)` trains on b random sequences of `seq_len` tokens.

    `step(b, accum=k)` splits the b sequences into k micro-batches of b/k, backpropagates each loss / k
    (gradients add up to those of the mean loss over all b) and takes one AdamW step. Gradients are
    released (set to None) at the start and end, so between steps only weights and AdamW state stay.
    """

    def __init__(self, config: GPTConfig, seq_len: int | None = None, device: Any = None, *,
                 amp_dtype: torch.dtype | None = None, lr: float = 3e-4, seed: int = 0):
        self.config = config
        self.seq_len = seq_len or config.block_size
        if not 1 <= self.seq_len <= config.block_size:
            raise ValueError(f"seq_len={seq_len} must be in 1..block_size ({config.block_size})")
        self.device = as_torch_device(device)
        self.amp_dtype = amp_dtype
        torch.manual_seed(seed)
        self.model = GPT(config, attn="sdpa").to(self.device)
        cuda = self.device.type == "cuda"
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=lr, **({"fused": True} if cuda else {}))
        self._gen = torch.Generator(device=self.device).manual_seed(seed)

    @property
    def n_params(self) -> int:
        return self.model.num_params()

    def flops_per_sequence(self) -> float:
        """Training FLOPs of one sequence: (6N + 12·L·H·Q·T) per token × T tokens (nanoGPT/PaLM)."""
        c = self.config
        return transformer_flops_per_token(self.n_params, c.n_layer, c.n_head, c.n_embd // c.n_head,
                                           self.seq_len) * self.seq_len

    def batch(self, b: int) -> tuple[torch.Tensor, torch.Tensor]:
        """b random sequences (token ids, the targets shifted by one), made on the device."""
        ids = torch.randint(self.config.vocab_size, (b, self.seq_len + 1), device=self.device, generator=self._gen)
        return ids[:, :-1].contiguous(), ids[:, 1:].contiguous()

    def __call__(self, b: int, accum: int = 1) -> None:
        _check_int("batch size", b, 1)
        _check_int("accum", accum, 1)
        if b % accum:
            raise ValueError(f"accum={accum} must divide the batch size {b}")
        self.opt.zero_grad(set_to_none=True)
        for _ in range(accum):
            x, y = self.batch(b // accum)
            with torch.autocast(self.device.type, dtype=self.amp_dtype or torch.bfloat16,
                                enabled=self.amp_dtype is not None):
                _, loss = self.model(x, y)
            (loss / accum).backward()
            del x, y, loss
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)

    def close(self) -> None:
        """Drop the model and optimizer (and, on CUDA, return their memory to the driver)."""
        self.model = self.opt = None  # type: ignore[assignment]
        _release(self.device)


def gpt_step_memory_estimate(config: GPTConfig, batch_size: int, seq_len: int | None = None,
                             bytes_per_value: int = 4) -> int:
    """A rough estimate of a GPT training step's memory, for a *simulated* device limit on a CPU.

    Weights, gradients and the two AdamW moments: 16 bytes per parameter (FP32). Activations kept for the
    backward pass: about 16·d values per layer per token (layer-norm, attention and MLP inputs/outputs) plus
    2·vocab per token (logits and their softmax), `bytes_per_value` each. Real use differs by the kernels
    and the allocator; on a GPU measure it (torch.cuda.max_memory_allocated) instead.
    """
    _check_int("batch_size", batch_size, 1)
    t = seq_len or config.block_size
    d, L, V = config.n_embd, config.n_layer, config.vocab_size
    params = V * d + config.block_size * d + L * 12 * d * d
    per_token = 16 * d * L + 2 * V
    return 16 * params + batch_size * t * per_token * bytes_per_value


def batch_sweep(step: Callable[[int], Any], batch_sizes: Sequence[int], *, seq_len: int | None = None,
                flops_per_sequence: float | None = None, dtype: str | None = None, min_time_s: float | None = None,
                device: Any = None, progress: bool = True, rounds: int = 0,
                round_s: float | None = None) -> tuple[list[dict[str, Any]], dict[int, RunResult]]:
    """Each batch size through `gl.measure`: time, tokens/s, MFU, NVML/GPM utilization; peak memory on CUDA.

    `step(b)` trains on b sequences of `seq_len` tokens (any callable; a `GPTTrainStep` brings its own `seq_len`
    and `flops_per_sequence()`). A batch size that runs out of memory (near the limit, the allocator's
    fragmentation can differ from the search's) gets a row with oom=True and the sweep goes on. `rounds` adds
    that many short interleaved rounds over the sizes that ran (the order reversed each round, `round_s` timed
    seconds each, None: a tenth of `min_time_s`) to each size's step times: a step the host launches drifts by
    10-20% over a minute, and one contiguous window per size samples one moment of that drift, so sizes timed a
    few seconds apart would differ by when they ran. The rounds spread each size's steps over the whole sweep.
    The monitor's readings (NVML, GPM) come from each size's own window only. Returns the table rows
    (JSON-able) and the RunResults by batch size (with their monitor traces).
    """
    checks.positive_int("rounds", rounds, minimum=0)
    checks.positive_float("round_s", round_s, allow_none=True)
    dev_info = device if hasattr(device, "is_cuda") else get_device()
    seq_len = seq_len or step.seq_len
    fps = flops_per_sequence if flops_per_sequence is not None else step.flops_per_sequence()
    sdev = getattr(step, "device", None) or dev_info.torch_device
    cuda = sdev.type == "cuda"
    errors: dict[int, str] = {}
    runs: dict[int, RunResult] = {}
    peaks: dict[int, float | None] = {}
    sizes = list(dict.fromkeys(batch_sizes))
    for b in tqdm(sizes, desc="batch sizes", disable=not progress):
        if cuda:
            synchronize(sdev)
            torch.cuda.reset_peak_memory_stats(sdev)
        run, error = None, None
        try:
            run = measure(lambda: step(b), label=f"batch {b}", flops=fps * b, dtype=dtype,
                          items=b * seq_len, item_name="tokens", min_time_s=min_time_s, device=dev_info)
        except RuntimeError as e:
            if not is_oom(e):
                raise
            error = f"{type(e).__name__}: {str(e).splitlines()[0][:120]}"
        if run is None:  # out of the except block: the failed step's tensors can be freed now
            _release(sdev)
            errors[b] = error or "out of memory"
            continue
        peaks[b] = torch.cuda.max_memory_allocated(sdev) / 1e9 if cuda else None
        runs[b] = run
    round_s = round_s or (min_time_s or default_min_time(dev_info)) / 10
    ran = [b for b in sizes if b in runs]
    for i in range(rounds):
        for b in (ran if i % 2 == 0 else ran[::-1]):
            if b in errors:  # ran out of memory in an earlier round: its window and earlier rounds stand
                continue
            try:
                extra = benchmark(lambda: step(b), min_time_s=round_s, device=sdev, **ROUND)
            except RuntimeError as e:
                if not is_oom(e):
                    raise
                errors[b] = "out of memory in an interleaved round"
                extra = None
            if extra is None:
                _release(sdev)
                continue
            runs[b].measurement = runs[b].measurement.merged(extra)
            runs[b].measurement.meta["interleaved_rounds"] = i + 1
    rows = []
    for b in sizes:
        run = runs.get(b)
        if run is None:
            rows.append(dict(batch_size=b, oom=True, error=errors[b], step_ms=None, tokens_per_s=None,
                             samples_per_s=None, tflops=None, mfu=None, nvml_util=None, gpm_sm_active=None,
                             gpm_tensor_active=None, cpu_percent=None, peak_mem_gb=None, noisy=None))
            continue
        rows.append(dict(batch_size=b, oom=False, error=None, step_ms=run.seconds * 1e3,
                         tokens_per_s=run.throughput, samples_per_s=run.throughput / seq_len,
                         tflops=run.tflops, mfu=run.mfu, nvml_util=run.metric("nvml_util"),
                         gpm_sm_active=run.metric("gpm_sm_active"), gpm_tensor_active=run.metric("gpm_tensor_active"),
                         cpu_percent=run.metric("cpu_percent"), peak_mem_gb=peaks[b], noisy=run.measurement.noisy))
    return rows, runs


def utilization_rounds(step: Callable[[int], Any], sizes: Sequence[int], *, rounds: int = 6, window_s: float = 0.5,
                       preroll_s: float = 0.2, seq_len: int, flops_per_sequence: float, dtype: str | None = None,
                       device: Any = None, metric: str = "nvml_util"
                       ) -> tuple[list[dict[str, Any]], dict[int, RunResult], dict[int, list[float | None]]]:
    """The sizes' monitored windows in `rounds` interleaved rounds (the order reversed each round), each window
    `window_s` long: the utilization at each size per round, for a difference judged over rounds (`round_rise`).

    One long window per size reads the host's speed of that moment: where the smaller size's step is partly
    launch-bound, its NVML reading moves with the host's drift over seconds, so two long windows back to back
    give an interval (the spread of NVML's samples) that misses how far the next run lands. Rounds spread both
    sizes over the same moments. Before each window the step runs `preroll_s` untimed and unmonitored: NVML's
    first sample in a window averages a period (up to 1/6 s on a Hopper) that began before it, which must hold
    this size's work, not the other size's. Returns rows as `batch_sweep`'s (NVML and GPM: the mean over rounds;
    step time: over all rounds' steps), the RunResults with their step times merged, and per size the `metric`
    of each round (None where a window got no sample). A size that runs out of memory gets an oom row; the
    rounds stop there.
    """
    checks.positive_int("rounds", rounds)
    checks.positive_float("window_s", window_s)
    checks.positive_float("preroll_s", preroll_s, allow_zero=True)
    dev_info = device if hasattr(device, "is_cuda") else get_device()
    sdev = getattr(step, "device", None) or dev_info.torch_device
    cuda = sdev.type == "cuda"
    sizes = list(dict.fromkeys(sizes))
    runs: dict[int, RunResult] = {}
    per_round: dict[int, list[float | None]] = {b: [] for b in sizes}
    metrics: dict[int, dict[str, list[float]]] = {b: {} for b in sizes}
    peaks: dict[int, float | None] = {b: None for b in sizes}
    oom: dict[int, str] = {}
    for i in range(rounds):
        for b in (sizes if i % 2 == 0 else sizes[::-1]):
            fn = (lambda b=b: step(b))
            if cuda:
                synchronize(sdev)
                torch.cuda.reset_peak_memory_stats(sdev)
            run = None
            try:
                t0 = time.perf_counter()
                fn()
                while time.perf_counter() - t0 < preroll_s:  # the GPU keeps this size's work queued into the window
                    fn()
                run = measure(fn, label=f"batch {b}", flops=flops_per_sequence * b, dtype=dtype, items=b * seq_len,
                              item_name="tokens", min_time_s=window_s, device=dev_info, warm=True)
            except RuntimeError as e:
                if not is_oom(e):
                    raise
                oom[b] = f"{type(e).__name__}: {str(e).splitlines()[0][:120]}"
            if run is None:  # out of the except block: the failed step's tensors can be freed now
                _release(sdev)
                break
            if cuda:
                peaks[b] = max(peaks[b] or 0.0, torch.cuda.max_memory_allocated(sdev) / 1e9)
            per_round[b].append(run.metric(metric))
            for m in ("nvml_util", "gpm_sm_active", "gpm_tensor_active", "cpu_percent"):
                v = run.metric(m)
                if v is not None:
                    metrics[b].setdefault(m, []).append(v)
            if b in runs:
                runs[b].measurement = runs[b].measurement.merged(run.measurement)
                runs[b].measurement.meta["interleaved_rounds"] = i + 1
            else:
                runs[b] = run
        if oom:
            break
    rows = []
    for b in sizes:
        run, mean = runs.get(b), (lambda m: statistics.fmean(metrics[b][m]) if metrics[b].get(m) else None)
        if b in oom or run is None:
            runs.pop(b, None)
            rows.append(dict(batch_size=b, oom=True, error=oom.get(b, "not run"), step_ms=None, tokens_per_s=None,
                             samples_per_s=None, tflops=None, mfu=None, nvml_util=None, gpm_sm_active=None,
                             gpm_tensor_active=None, cpu_percent=None, peak_mem_gb=None, noisy=None))
            continue
        rows.append(dict(batch_size=b, oom=False, error=None, step_ms=run.seconds * 1e3, tokens_per_s=run.throughput,
                         samples_per_s=run.throughput / seq_len, tflops=run.tflops, mfu=run.mfu,
                         nvml_util=mean("nvml_util"), gpm_sm_active=mean("gpm_sm_active"),
                         gpm_tensor_active=mean("gpm_tensor_active"), cpu_percent=mean("cpu_percent"),
                         peak_mem_gb=peaks[b], noisy=run.measurement.noisy, rounds=len(per_round[b]),
                         round_values=per_round[b]))
    return rows, runs, per_round


def round_rise(low: Sequence[float | None], high: Sequence[float | None]) -> Estimate | None:
    """high - low per round (`utilization_rounds`: the same round's two windows), as the median of the rounds'
    differences with its order-statistic 95% interval (`Estimate.median_of`: the whole range up to 8 rounds).
    A round where either window has no reading is left out; None with fewer than two rounds left."""
    diffs = [h - lo for lo, h in zip(low, high) if lo is not None and h is not None]
    return Estimate.median_of(diffs) if len(diffs) >= 2 else None


def peak_memory_gb(fn: Callable[[], Any], device: Any = None) -> float | None:
    """Peak GPU memory allocated while `fn()` runs once, in GB (None off CUDA: no allocator to ask)."""
    dev = as_torch_device(device)
    if dev.type != "cuda":
        fn()
        return None
    synchronize(dev)
    torch.cuda.reset_peak_memory_stats(dev)
    fn()
    synchronize(dev)
    return torch.cuda.max_memory_allocated(dev) / 1e9


def column(rows: Sequence[dict[str, Any]], key: str, scale: float = 1.0) -> list[float | None]:
    """One column of a table of rows, scaled (None stays None): for plots."""
    return [None if r.get(key) is None else r[key] * scale for r in rows]


def row_for(rows: Sequence[dict[str, Any]], key: str, value: Any) -> dict[str, Any] | None:
    """The first row whose `key` equals `value`, or None."""
    return next((r for r in rows if r.get(key) == value), None)


# ---------------------------------------------------------------- reading a sweep with its spread

def trace_estimate(run: RunResult | None, metric: str) -> Estimate | None:
    """A monitored run's mean of `metric` (NVML utilization, ...) with the quartiles of its samples as the
    interval (`Trace.estimate`); None when the run or the metric was not recorded."""
    return run.trace.estimate(metric) if run is not None and run.trace is not None else None


def rate_over_windows(run: Any) -> Estimate | None:
    """A sweep point's throughput (items over the median step) with an interval that holds both the quartiles of
    its steps and the 95% order-statistic interval of its windows' rates (the monitored window and each
    interleaved round: their range up to 8 windows). The quartiles are a step's jitter within one window; the
    windows' spread is the host's drift between the moments they ran, which the quartiles of one window miss.
    Without rounds (one window) it is `throughput_estimate()` unchanged."""
    est = run.throughput_estimate() if run is not None else None
    m = getattr(run, "measurement", None)
    meds = m.round_medians if m is not None else []
    if est is None or len(meds) < 2:
        return est
    lo, hi = median_interval([run.items / t for t in meds])
    return Estimate(est.value, min(est.lo, lo), max(est.hi, hi))


def sweet_spot(sizes: Sequence[int], throughput: dict[int, Estimate], memory: dict[int, float]) -> Estimate | None:
    """The batch size past which a bigger batch buys relatively less throughput than it costs in memory.

    The guide's table (§6.2) marks 32 as the sweet spot: 8 -> 16 -> 32 each raise throughput by more (1.83x,
    1.73x) than memory (1.5x, 1.56x); 32 -> 64 raises it by less (1.26x for 1.61x the memory). So, over the
    sizes in order, the sweet spot is the first size whose next step gains a smaller factor of throughput
    than of memory (the largest size if none does). The interval comes from the throughput intervals: the
    earliest size whose step *could* gain less, to the first whose step *surely* does. Memory (the
    allocator's peak) is taken as exact.
    """
    xs = [b for b in sorted(set(sizes)) if b in throughput and memory.get(b)]
    if not xs:
        return None
    point = could = sure = None
    for b, nxt in zip(xs, xs[1:]):
        t0, t1 = throughput[b], throughput[nxt]
        mem_gain = memory[nxt] / memory[b]
        if point is None and t1.value / t0.value < mem_gain:
            point = b
        if could is None and t1.lo / t0.hi < mem_gain:
            could = b
        if sure is None and t1.hi / t0.lo < mem_gain:
            sure = b
    last = xs[-1]
    point, could, sure = (last if v is None else v for v in (point, could, sure))
    return Estimate(point, min(could, point), max(sure, point))



def run_largest(run: Callable[[int], Any], candidates: Sequence[int], *, device: Any = None) -> tuple[int, Any]:
    """`run(b)` for the largest batch size in `candidates` that does not run out of memory.

    A batch that fit a search's few steps can still run out of memory in a longer timed run (fragmentation,
    a second model's buffers): then the next smaller candidate is tried, memory released in between.
    Returns (the batch size that ran, what `run` returned); raises the last OOM if none ran.
    """
    sizes = sorted({int(b) for b in candidates}, reverse=True)
    if not sizes or sizes[-1] < 1:
        raise ValueError(f"candidates={list(candidates)!r} must hold positive batch sizes")
    dev = torch.device(device) if device is not None else torch.device("cuda" if torch.cuda.is_available() else "cpu")
    last: BaseException | None = None
    for b in sizes:
        failed = False
        try:
            return b, run(b)
        except Exception as e:  # noqa: BLE001 - only OOM is retried; anything else is re-raised below
            if not is_oom(e):
                raise
            # Without its traceback: the failed step's frames, and the tensors they hold, must not outlive it
            # (they would sit in memory under every later measurement of this process).
            last, failed = e.with_traceback(None), True
        if failed:  # outside the except block: the traceback no longer holds the step's tensors
            _release(dev)
    assert last is not None
    raise last
