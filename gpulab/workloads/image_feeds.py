"""Notebook 05's image pipeline: a CNN train step, endless loaders, the time to load a batch, the workers that keep a
step fed and when each epoch's first batch arrives."""
from __future__ import annotations

import copy
import math
import statistics
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Sequence

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset, RandomSampler

from ..measuring import checks
from ..measuring.estimates import Estimate
from ..measuring.device import as_torch_device
from ..measuring.flops import count_flops
from ..tools.dataloading import _shutdown, endless_loader, workers


def worker_counts(cores: int, extra: Sequence[int] = ()) -> list[int]:
    """Worker counts to sweep on a host with `cores` CPU cores: 0, 1, 2, 4, 8, ... plus half the cores and all.

    Half the cores is always included: the guide's table (§5.4) puts the optimum there on its 8-core machine.
    """
    checks.positive_int("cores", cores)
    out = {0, cores, max(1, cores // 2)} | {2**i for i in range(cores.bit_length()) if 2**i <= cores}
    out |= {w for w in extra if 0 <= w <= cores}
    return sorted(out)


def cnn_train_step(model: nn.Module, device: Any = None, *, lr: float = 0.01,
                   amp_dtype: torch.dtype | None = None) -> Callable[[torch.Tensor, torch.Tensor], None]:
    """A training step `step(x, y)` for an image classifier on already-on-device batches (SGD with momentum) that
    never reads a value back. On CUDA: channels-last memory (for cuDNN's tensor-core convolutions), `amp_dtype`."""
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
    checks.positive_int("image_size", image_size)
    m = copy.deepcopy(model).float().cpu()
    x = torch.randn(2, channels, image_size, image_size)

    def fwd_bwd():
        m(x).float().sum().backward()

    return count_flops(fwd_bwd).total / 2


def random_image_batches(n: int, batch_size: int, image_size: int, num_classes: int = 10, *,
                         pin_memory: bool = False, seed: int = 0) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """`n` random (normalized-image-like, never zero) CPU batches, pinned when asked and CUDA is present."""
    for name, v in (("n", n), ("batch_size", batch_size), ("image_size", image_size), ("num_classes", num_classes)):
        checks.positive_int(name, v)
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
    checks.positive_int("batches", batches)
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

    def ratio_estimate(self) -> Estimate:
        """`ratio` with an interval from both modes' quartiles over epochs 2.. (q1 / q3 to q3 / q1)."""
        from ..measuring.measurement import quantiles

        r1, _, r3 = quantiles(self.first_batch_s["respawn"][1:])
        p1, _, p3 = quantiles(self.first_batch_s["persistent"][1:])
        v = self.ratio
        return Estimate(v, min(v, r1 / p3), max(v, r3 / p1))

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
    checks.positive_int("num_workers", num_workers)
    checks.positive_int("epochs", epochs, minimum=2)
    checks.positive_int("batches_per_epoch", batches_per_epoch)
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
