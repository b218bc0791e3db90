"""Batch-size sweeps: time a GPT step at any batch size, read throughput, utilization and memory per size with
their spread, and find the guide's sweet spot.

    step = GPTTrainStep(GPTConfig.gpt2_small(), seq_len=1024, device=dev, amp_dtype=torch.bfloat16)
    rows, runs = batch_sweep(step, [1, 2, 4, 8, 16, 32, 64])     # throughput, MFU, utilization, peak memory

The step draws random token ids on the device (never zeros): there is no loader and no queue, so a step's
throughput is items over its median time. The search for the largest batch that fits is in `gpulab.tools.batchsize`.
"""
from __future__ import annotations

import statistics
import time
from typing import Any, Callable, Sequence

import torch

from tqdm.auto import tqdm

from ..measuring.estimates import Estimate, median_interval
from ..measuring.device import as_torch_device, get_device, synchronize
from ..measuring import checks
from ..verdicts.experiment import default_min_time, measure
from ..verdicts.run_result import RunResult
from ..measuring.memory import is_oom
from ..measuring.memory import release as _release
from ..measuring.flops import transformer_flops_per_token
from ..measuring.timing import ROUND, benchmark
from .models import GPT, GPTConfig



# ---------------------------------------------------------------- a GPT step at any batch size

class GPTTrainStep:
    """One GPT training step at any batch size: `step(b)` trains on b random sequences of `seq_len` tokens.

    `step(b, accum=k)` takes one AdamW step over k micro-batches of b/k. Gradients are released at the start and
    end, so between steps only weights and AdamW state stay."""

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
        checks.positive_int("batch size", b)
        checks.positive_int("accum", accum)
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

    16 bytes per parameter (FP32 weights, gradients, two AdamW moments), plus activations: about 16·d values per
    layer per token and 2·vocab per token (logits and softmax). On a GPU measure it instead."""
    checks.positive_int("batch_size", batch_size)
    t = seq_len or config.block_size
    d, L, V = config.n_embd, config.n_layer, config.vocab_size
    params = V * d + config.block_size * d + L * 12 * d * d
    per_token = 16 * d * L + 2 * V
    return 16 * params + batch_size * t * per_token * bytes_per_value


def _oom_row(b: int, error: str) -> dict[str, Any]:
    """A sweep row for a batch size that did not run (out of memory): its error, every measurement None."""
    return dict(batch_size=b, oom=True, error=error, step_ms=None, tokens_per_s=None, samples_per_s=None, tflops=None,
                mfu=None, nvml_util=None, gpm_sm_active=None, gpm_tensor_active=None, cpu_percent=None,
                peak_mem_gb=None, noisy=None)


def batch_sweep(step: Callable[[int], Any], batch_sizes: Sequence[int], *, seq_len: int | None = None,
                flops_per_sequence: float | None = None, dtype: str | None = None, min_time_s: float | None = None,
                device: Any = None, progress: bool = True, rounds: int = 0,
                round_s: float | None = None) -> tuple[list[dict[str, Any]], dict[int, RunResult]]:
    """Each batch size through `gl.measure`: time, tokens/s, MFU, NVML/GPM utilization; peak memory on CUDA.

    A batch size that runs out of memory gets a row with oom=True and the sweep goes on. `rounds` adds that many
    interleaved rounds over the sizes that ran (`round_s` each, None: a tenth of `min_time_s`) to each size's step
    times: a step the host launches drifts by 10-20% over a minute, so sizes timed seconds apart would differ by
    when they ran. NVML and GPM come from each size's own window. Returns the rows and the RunResults by size."""
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
            rows.append(_oom_row(b, errors[b]))
            continue
        rows.append(dict(batch_size=b, oom=False, error=None, step_ms=run.seconds * 1e3,
                         tokens_per_s=run.throughput, samples_per_s=run.throughput / seq_len,
                         tflops=run.tflops, mfu=run.mfu, nvml_util=run.metric("nvml_util"),
                         gpm_sm_active=run.metric("gpm_sm_active"), gpm_tensor_active=run.metric("gpm_tensor_active"),
                         cpu_percent=run.metric("cpu_percent"), peak_mem_gb=peaks[b], noisy=run.measurement.noisy))
    return rows, runs


def utilization_rounds(step: Callable[[int], Any], sizes: Sequence[int], *, rounds: int = 6, window_s: float = 0.5,
                       preroll_s: float = 0.2, seq_len: int, flops_per_sequence: float, dtype: str | None = None,
                       device: Any = None, metric: str = "nvml_util", progress: bool = True
                       ) -> tuple[list[dict[str, Any]], dict[int, RunResult], dict[int, list[float | None]]]:
    """The sizes' monitored windows in `rounds` interleaved rounds (the order reversed each round), each `window_s`
    long: the utilization at each size per round, for a difference judged over rounds (`round_rise`).

    Where the smaller size's step is partly launch-bound, its NVML reading moves with the host's drift over seconds,
    so one long window per size gives an interval that misses how far the next run lands; rounds spread both sizes
    over the same moments. Before each window the step runs `preroll_s` unmonitored: NVML's first sample averages
    a period (up to 1/6 s on a Hopper) that began before the window. Returns rows as `batch_sweep`'s, the RunResults
    with their step times merged, and per size the `metric` of each round (None without a sample); the rounds stop
    at a size that runs out of memory."""
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
    bar = tqdm(range(rounds), desc=f"batch {', '.join(map(str, sizes))}: interleaved rounds", leave=False,
               disable=not progress)
    for i in bar:
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
    bar.close()  # also when out of memory ended the rounds early
    rows = []
    for b in sizes:
        run, mean = runs.get(b), (lambda m: statistics.fmean(metrics[b][m]) if metrics[b].get(m) else None)
        if b in oom or run is None:
            runs.pop(b, None)
            rows.append(_oom_row(b, oom.get(b, "not run")))
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


def round_gain(low: Sequence[float | None], high: Sequence[float | None]) -> Estimate | None:
    """% more of a reading at `high` than at `low`, per round ((high / low - 1) * 100, the same round's two windows
    from `utilization_rounds`), as the median of the rounds' gains with its order-statistic 95% interval. A round
    where either window has no reading, or `low` reads 0, is left out; None with fewer than two rounds left."""
    gains = [(h / lo - 1) * 100 for lo, h in zip(low, high) if lo is not None and h is not None and lo > 0]
    return Estimate.median_of(gains) if len(gains) >= 2 else None


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

    The guide's table (§6.2) marks 32: 8 -> 16 -> 32 each raise throughput by more (1.83x, 1.73x) than memory
    (1.5x, 1.56x); 32 -> 64 by less (1.26x for 1.61x). So the sweet spot is the first size whose next step gains a
    smaller factor of throughput than of memory (else the largest). The interval runs from the earliest size whose
    step *could* gain less to the first whose step *surely* does; memory (the allocator's peak) is taken as exact."""
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
    """`run(b)` for the largest batch size in `candidates` that does not run out of memory: a batch that fit a
    search's few steps can still run out in a longer run; then the next smaller one is tried. Returns (b, result)."""
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
