"""Lab pieces for notebooks 05 (feeding the GPU) and 06 (batch size): training steps, endless feeds, sweeps.

Notebook 05 times a small CNN fed by a DataLoader of JPEG files under different loader settings:

    step = cnn_train_step(SmallCNN(width=64), device, amp_dtype=torch.bfloat16)
    with Feed(endless_loader(ds, batch_size=64, num_workers=8, pin_memory=True), step, device) as feed:
        run = gl.measure(lambda: feed.run(4), items=4 * 64)        # 4 batches per call, workers stay alive

Notebook 06 times one GPT training step at any batch size (random token ids, never zeros):

    step = GPTTrainStep(GPTConfig.gpt2_small(), seq_len=1024, device=dev, amp_dtype=torch.bfloat16)
    step(64)                      # one optimizer step on 64 sequences
    step(64, accum=4)             # the same 64 sequences as 4 micro-batches of 16, one optimizer step
    rows = batch_sweep(step, [1, 2, 4, 8, 16, 32, 64])     # throughput, MFU, utilization, peak memory

Everything here runs on a CPU too (smaller sizes); CUDA-only steps (pinned memory, peak memory) are skipped.
"""
from __future__ import annotations

import copy
import math
import statistics
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Iterable, Iterator, Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset, RandomSampler
from tqdm.auto import tqdm

from .dataloading import CUDAPrefetcher, _check_int, as_torch_device, synchronize, to_device
from .device import get_device, usable_cores  # noqa: F401  (usable_cores: used by notebook 05)
from .experiment import RunResult, measure
from .flops import count_flops, transformer_flops_per_token
from .workloads import _MEAN, _STD, GPT, GPTConfig

_ENDLESS = 2**40  # samples in an "endless" epoch: no run of the notebook ever reaches its end


# ---------------------------------------------------------------- notebook 05: the CNN and its feed

def denormalize(x: torch.Tensor) -> torch.Tensor:
    """A normalized (3, H, W) image tensor from SyntheticImageDataset back to (H, W, 3) in [0, 1], to show it."""
    mean, std = torch.tensor(_MEAN).view(3, 1, 1), torch.tensor(_STD).view(3, 1, 1)
    return (x.detach().cpu() * std + mean).clamp(0, 1).permute(1, 2, 0)


def worker_counts(cores: int, extra: Sequence[int] = ()) -> list[int]:
    """Worker counts to sweep on a host with `cores` CPU cores: 0, 1, 2, 4, 8, ... plus half the cores and all.

    Half the cores is always included: the guide's table (§5.4) puts the optimum there on its 8-core machine.
    """
    _check_int("cores", cores, 1)
    out = {0, cores, max(1, cores // 2)} | {2**i for i in range(cores.bit_length()) if 2**i <= cores}
    out |= {w for w in extra if 0 <= w <= cores}
    return sorted(out)


def cnn_train_step(model: nn.Module, device: Any = None, *, lr: float = 0.01,
                   amp_dtype: torch.dtype | None = None) -> Callable[[torch.Tensor, torch.Tensor], None]:
    """A training step `step(x, y)` for an image classifier already-on-device batches: forward,
    cross-entropy, backward, SGD with momentum. It never reads a value back (no sync), as a fast loop should.

    On CUDA the model uses channels-last memory (the layout cuDNN's tensor-core convolutions want) and,
    with `amp_dtype`, autocast.
    """
    dev = as_torch_device(device)
    cuda = dev.type == "cuda"
    model = model.to(dev, memory_format=torch.channels_last) if cuda else model.to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)

    def step(x: torch.Tensor, y: torch.Tensor) -> None:
        if cuda:
            x = x.contiguous(memory_format=torch.channels_last)
        with torch.autocast(dev.type, dtype=amp_dtype or torch.bfloat16, enabled=amp_dtype is not None):
            loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    step.model = model  # type: ignore[attr-defined]
    return step


def cnn_train_flops_per_sample(model: nn.Module, image_size: int, channels: int = 3) -> float:
    """Training FLOPs per image (forward + backward convolutions and matmuls, FlopCounterMode), counted on a
    CPU copy of `model` with a batch of 2 (these FLOPs grow linearly with the batch)."""
    _check_int("image_size", image_size, 1)
    m = copy.deepcopy(model).float().cpu()
    x = torch.randn(2, channels, image_size, image_size)

    def fwd_bwd():
        m(x).float().sum().backward()

    return count_flops(fwd_bwd).total / 2


def endless_loader(dataset: Dataset, *, batch_size: int, num_workers: int = 0, pin_memory: bool = False,
                   prefetch_factor: int | None = 2, persistent_workers: bool = False, seed: int = 0,
                   **kwargs: Any) -> DataLoader:
    """A DataLoader whose single epoch never ends (random samples with replacement, seeded): one iterator
    can feed any number of timed calls without an epoch boundary (worker restart) in the middle.

    pin_memory=True is dropped without CUDA (it only helps, and only works, with a GPU). prefetch_factor
    and persistent_workers only apply with workers.
    """
    _check_int("batch_size", batch_size, 1)
    _check_int("num_workers", num_workers, 0)
    sampler = RandomSampler(dataset, replacement=True, num_samples=_ENDLESS,
                            generator=torch.Generator().manual_seed(seed))
    extra = dict(prefetch_factor=prefetch_factor, persistent_workers=persistent_workers) if num_workers else {}
    return DataLoader(dataset, batch_size=batch_size, sampler=sampler, num_workers=num_workers,
                      pin_memory=pin_memory and torch.cuda.is_available(), **extra, **kwargs)


def _shutdown(it: Any) -> None:
    if hasattr(it, "_shutdown_workers"):
        it._shutdown_workers()


class Feed:
    """An endless stream of batches feeding a training step: `run(n)` trains on the next `n` batches.

    `source` is any endless iterable of (x, y) CPU batches: an `endless_loader`, or `cycle(batches)`.
    The plain loop copies each batch with `.to(device, non_blocking=...)` right before its step (on the
    compute stream); with `prefetch=True` a `CUDAPrefetcher` copies batch i+1 on a side stream while batch i
    computes (off CUDA it is the plain loop). The source is started (its workers forked) at the first
    `run`, so an untimed first call absorbs the start-up. Use as a context manager: closing stops the workers.
    """

    def __init__(self, source: Iterable, step: Callable[[Any, Any], Any], device: Any = None, *,
                 prefetch: bool = False, non_blocking: bool | None = None):
        if not callable(step):
            raise ValueError("step must be callable as step(x, y)")
        self.device = as_torch_device(device)
        self.source, self.step = source, step
        pinned = bool(getattr(source, "pin_memory", False))
        self.non_blocking = pinned if non_blocking is None else non_blocking
        self.prefetch = prefetch and self.device.type == "cuda"
        self._source_it: Iterator | None = None
        self._it: Iterator | None = None
        self.batches = 0
        self.samples = 0

    def _start(self) -> Iterator:
        self._source_it = iter(self.source)
        self._it = iter(CUDAPrefetcher(self._source_it, self.device)) if self.prefetch else self._source_it
        return self._it

    def run(self, n: int) -> None:
        """Train on the next `n` batches (no synchronize: time it with gl.benchmark / gl.measure)."""
        it = self._it or self._start()
        for _ in range(n):
            x, y = next(it)
            if not self.prefetch:
                x, y = to_device((x, y), self.device, non_blocking=self.non_blocking)
            self.step(x, y)
            self.batches += 1
            self.samples += len(x)

    def close(self) -> None:
        """Stop the source's worker processes (if any); a later `run` starts them again."""
        if self._it is not None and self._it is not self._source_it and hasattr(self._it, "close"):
            self._it.close()  # the prefetcher's generator
        if self._source_it is not None:
            _shutdown(self._source_it)
        self._it = self._source_it = None

    def __enter__(self) -> Feed:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def cycle(batches: Sequence[Any]) -> Iterator[Any]:
    """The same few batches over and over: a source with no loading cost at all."""
    if not batches:
        raise ValueError("batches must not be empty")
    while True:
        yield from batches


def random_image_batches(n: int, batch_size: int, image_size: int, num_classes: int = 10, *,
                         pin_memory: bool = False, seed: int = 0) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """`n` random (normalized-image-like, never zero) CPU batches, pinned when asked and CUDA is present."""
    for name, v in (("n", n), ("batch_size", batch_size), ("image_size", image_size), ("num_classes", num_classes)):
        _check_int(name, v, 1)
    g = torch.Generator().manual_seed(seed)
    pin = pin_memory and torch.cuda.is_available()
    out = []
    for _ in range(n):
        x = torch.randn(batch_size, 3, image_size, image_size, generator=g)
        y = torch.randint(num_classes, (batch_size,), generator=g)
        out.append((x.pin_memory(), y.pin_memory()) if pin else (x, y))
    return out


def time_batch_loading(dataset: Dataset, batch_size: int, batches: int = 5, seed: int = 0) -> float:
    """Median seconds one process takes to load (decode, augment, collate) one batch: num_workers=0, no model."""
    _check_int("batches", batches, 1)
    loader = endless_loader(dataset, batch_size=batch_size, num_workers=0, seed=seed)
    it = iter(loader)
    next(it)  # first batch: file cache, imports
    times = []
    for _ in range(batches):
        t0 = time.perf_counter()
        next(it)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def workers_to_feed(load_s_per_batch: float, step_s_per_batch: float) -> int:
    """Workers needed so that loading keeps up with the GPU: ceil(load time / step time), at least 1."""
    if load_s_per_batch <= 0 or step_s_per_batch <= 0:
        raise ValueError("load and step times must be > 0")
    return max(1, math.ceil(load_s_per_batch / step_s_per_batch))


def throughput_by_workers(rows: Sequence[dict[str, Any]], **match: Any) -> dict[int, float]:
    """From `tune_dataloader` rows: the best samples/s per worker count, among rows matching `match`
    (e.g. pin_memory=True)."""
    out: dict[int, float] = {}
    for r in rows:
        if all(r.get(k) == v for k, v in match.items()):
            out[r["num_workers"]] = max(out.get(r["num_workers"], 0.0), r["samples_per_s"])
    return dict(sorted(out.items()))


def knee(throughput: dict[int, float], fraction: float = 0.95) -> int | None:
    """The smallest setting that reaches `fraction` of the best throughput (the point past which more
    only adds a little); None for an empty table."""
    if not 0 < fraction <= 1:
        raise ValueError(f"fraction={fraction} must be in (0, 1]")
    if not throughput:
        return None
    best = max(throughput.values())
    return min(k for k, v in throughput.items() if v >= fraction * best)


@dataclass
class EpochStarts:
    """Seconds from `iter(loader)` to the first batch, per epoch, with and without persistent workers."""

    num_workers: int
    batch_size: int
    batches_per_epoch: int
    first_batch_s: dict[str, list[float]] = field(default_factory=dict)  # "persistent"/"respawn" -> per epoch
    epoch_s: dict[str, list[float]] = field(default_factory=dict)

    def later_epochs(self, mode: str) -> float:
        """Median time to the first batch over epochs 2.. (epoch 1 starts the workers in both modes)."""
        return statistics.median(self.first_batch_s[mode][1:])

    @property
    def ratio(self) -> float:
        """Epoch start (epochs 2..) with respawned workers over that with persistent ones."""
        return self.later_epochs("respawn") / self.later_epochs("persistent")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self) | {"ratio": self.ratio,
                               "later_epochs_s": {m: self.later_epochs(m) for m in self.first_batch_s}}


def epoch_start_times(dataset: Dataset, *, batch_size: int, num_workers: int, epochs: int = 4,
                      batches_per_epoch: int = 4, pin_memory: bool = False, prefetch_factor: int = 2,
                      seed: int = 0) -> EpochStarts:
    """Run `epochs` short epochs with persistent_workers False and True; time each epoch's first batch.

    Without persistent workers every epoch forks (or spawns) `num_workers` processes again and waits for
    them to load their first batch; with them the processes stay and only the first batch is waited for.
    """
    _check_int("num_workers", num_workers, 1)
    _check_int("epochs", epochs, 2)
    _check_int("batches_per_epoch", batches_per_epoch, 1)
    res = EpochStarts(num_workers=num_workers, batch_size=batch_size, batches_per_epoch=batches_per_epoch)
    n = batch_size * batches_per_epoch
    for mode, persistent in (("respawn", False), ("persistent", True)):
        sampler = RandomSampler(dataset, replacement=True, num_samples=n, generator=torch.Generator().manual_seed(seed))
        loader = DataLoader(dataset, batch_size=batch_size, sampler=sampler, num_workers=num_workers,
                            pin_memory=pin_memory and torch.cuda.is_available(), prefetch_factor=prefetch_factor,
                            persistent_workers=persistent)
        firsts, totals, it = [], [], None
        try:
            for _ in range(epochs):
                t0 = time.perf_counter()
                it = iter(loader)
                next(it)
                firsts.append(time.perf_counter() - t0)
                for _ in it:
                    pass
                totals.append(time.perf_counter() - t0)
        finally:
            if it is not None:
                _shutdown(it)
            del loader
        res.first_batch_s[mode], res.epoch_s[mode] = firsts, totals
    return res


def utilization_by_workers(dataset: Dataset, step: Callable[[Any, Any], Any], workers: Sequence[int], *,
                           batch_size: int, pin_memory: bool = False, prefetch_factor: int = 2,
                           batches_per_call: int = 4, flops_per_sample: float | None = None,
                           dtype: str | None = None, min_time_s: float | None = None, device: Any = None,
                           progress: bool = True) -> list[tuple[int, RunResult]]:
    """For each worker count: the training loop fed by an endless loader, through `gl.measure` (timing,
    NVML/GPM utilization and host CPU from the monitor). Workers start before timing and stay alive."""
    dev_info = device if hasattr(device, "is_cuda") else get_device()
    out = []
    for w in tqdm(list(workers), desc="utilization per worker count", disable=not progress):
        loader = endless_loader(dataset, batch_size=batch_size, num_workers=w, pin_memory=pin_memory,
                                prefetch_factor=prefetch_factor)
        with Feed(loader, step, dev_info.torch_device) as feed:
            n = batches_per_call * batch_size
            run = measure(lambda: feed.run(batches_per_call), label=f"num_workers={w}", items=n,
                          flops=flops_per_sample * n if flops_per_sample else None, dtype=dtype,
                          min_time_s=min_time_s, device=dev_info)
        out.append((w, run))
    return out


# ---------------------------------------------------------------- notebook 06: a GPT step at any batch size

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


def _release(device: torch.device) -> None:
    import gc
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def batch_sweep(step: GPTTrainStep, batch_sizes: Sequence[int], *, dtype: str | None = None,
                min_time_s: float | None = None, device: Any = None, progress: bool = True
                ) -> tuple[list[dict[str, Any]], dict[int, RunResult]]:
    """Each batch size through `gl.measure`: time, tokens/s, MFU, NVML/GPM utilization; peak memory on CUDA.

    A batch size that runs out of memory (near the limit, the allocator's fragmentation can differ from the
    search's) gets a row with oom=True and the sweep goes on. Returns the table rows (JSON-able) and the
    RunResults by batch size (with their monitor traces).
    """
    from .batchsize import is_oom

    dev_info = device if hasattr(device, "is_cuda") else get_device()
    cuda = step.device.type == "cuda"
    rows, runs = [], {}
    for b in tqdm(list(dict.fromkeys(batch_sizes)), desc="batch sizes", disable=not progress):
        if cuda:
            synchronize(step.device)
            torch.cuda.reset_peak_memory_stats(step.device)
        run, error = None, None
        try:
            run = measure(lambda: step(b), label=f"batch {b}", flops=step.flops_per_sequence() * b, dtype=dtype,
                          items=b * step.seq_len, item_name="tokens", min_time_s=min_time_s, device=dev_info)
        except RuntimeError as e:
            if not is_oom(e):
                raise
            error = f"{type(e).__name__}: {str(e).splitlines()[0][:120]}"
        if run is None:  # out of the except block: the failed step's tensors can be freed now
            _release(step.device)
            rows.append(dict(batch_size=b, oom=True, error=error, step_ms=None, tokens_per_s=None,
                             samples_per_s=None, tflops=None, mfu=None, nvml_util=None, gpm_sm_active=None,
                             gpm_tensor_active=None, cpu_percent=None, peak_mem_gb=None, noisy=None))
            continue
        peak = torch.cuda.max_memory_allocated(step.device) / 1e9 if cuda else None
        runs[b] = run
        rows.append(dict(batch_size=b, oom=False, error=None, step_ms=run.seconds * 1e3,
                         tokens_per_s=run.throughput, samples_per_s=run.throughput / step.seq_len,
                         tflops=run.tflops, mfu=run.mfu, nvml_util=run.metric("nvml_util"),
                         gpm_sm_active=run.metric("gpm_sm_active"), gpm_tensor_active=run.metric("gpm_tensor_active"),
                         cpu_percent=run.metric("cpu_percent"), peak_mem_gb=peak, noisy=run.measurement.noisy))
    return rows, runs


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
