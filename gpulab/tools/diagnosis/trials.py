"""Try a finding's fix on copies of the model and optimizer and time it against the step as written.

Each trial gets a time budget in seconds (not a count of steps): `gl.before_after` with its timed windows and as
many interleaved rounds as fit in it (`trial_plan`). The model and optimizer given are never touched: every trial
deep-copies them.
"""
from __future__ import annotations

import contextlib
import copy
import gc
from dataclasses import dataclass
from typing import Any, Callable

import torch

from ...verdicts.experiment import before_after

COMPILE_MIN_S = 90.0  # a first torch.compile of a training step takes tens of seconds: tried with this much left


@dataclass
class Loop:
    """What a trial rebuilds a step from: the user's model, optimizer, batch maker, loss and batch size."""

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer | None
    make_batch: Callable[[int], Any]
    loss_fn: Callable[[Any, Any], Any]
    batch_size: int
    device: torch.device
    loader: Any = None


def new_optimizer(opt: torch.optim.Optimizer | None, old: torch.nn.Module, new: torch.nn.Module,
                  **overrides: Any) -> torch.optim.Optimizer:
    """A fresh optimizer of `opt`'s class and hyperparameters over `new`'s parameters (AdamW where none was given)."""
    params = list(new.parameters())
    if opt is None:
        return torch.optim.AdamW(params, lr=1e-4, **overrides)
    index = {id(p): i for i, p in enumerate(old.parameters())}
    groups = [{**{k: v for k, v in g.items() if k != "params"}, **overrides,
               "params": [params[index[id(p)]] for p in g["params"]]} for g in opt.param_groups]
    try:  # the constructor checks fused/foreach itself (fused needs CUDA tensors and a supported dtype)
        return type(opt)(groups, **overrides)
    except TypeError:  # an optimizer whose constructor takes no such flag: the groups carry them
        return type(opt)(groups)


def fed_step(model: torch.nn.Module, opt: torch.optim.Optimizer, loss_fn: Callable[[Any, Any], Any], *,
             autocast: bool = False) -> Callable[[Any, Any], Any]:
    """One training step on (x, y): zero the grads, forward and loss (under BF16 autocast if asked), backward, step."""
    kind = next(model.parameters()).device.type

    def step(x: Any, y: Any) -> Any:
        opt.zero_grad(set_to_none=True)
        with torch.autocast(kind, torch.bfloat16) if autocast else contextlib.nullcontext():
            loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        return loss
    return step


def make_step(model: torch.nn.Module, opt: torch.optim.Optimizer, loss_fn: Callable[[Any, Any], Any],
              batch: Callable[[], tuple[Any, Any]], *, autocast: bool = False) -> Callable[[], Any]:
    """`fed_step` on the batch that `batch()` returns."""
    train = fed_step(model, opt, loss_fn, autocast=autocast)
    return lambda: train(*batch())


def _fixed(x: Any, y: Any) -> Callable[[], tuple[Any, Any]]:
    return lambda: (x, y)


def _as_channels_last(x: Any) -> Any:
    return x.to(memory_format=torch.channels_last) if isinstance(x, torch.Tensor) and x.dim() == 4 else x


def pair(loop: Loop, kind: str) -> tuple[Callable[[], Any], Callable[[], Any], dict[str, Any]]:
    """The step as written and the step with `kind`'s fix, each on its own copies; before_after's extra arguments."""
    m0 = copy.deepcopy(loop.model)
    before = make_step(m0, new_optimizer(loop.optimizer, loop.model, m0), loop.loss_fn,
                       _fixed(*loop.make_batch(loop.batch_size)))
    extra: dict[str, Any] = {"items": loop.batch_size, "item_name": "samples"}
    if kind == "fp32_matmul":
        after = make_step(m0, new_optimizer(loop.optimizer, loop.model, m0), loop.loss_fn,
                          _fixed(*loop.make_batch(loop.batch_size)), autocast=True)
    elif kind == "small_batch":
        after = make_step(m0, new_optimizer(loop.optimizer, loop.model, m0), loop.loss_fn,
                          _fixed(*loop.make_batch(2 * loop.batch_size)))
        extra["after_items"] = 2 * loop.batch_size
    elif kind == "layout":
        m1 = copy.deepcopy(loop.model).to(memory_format=torch.channels_last)
        x, y = loop.make_batch(loop.batch_size)
        after = make_step(m1, new_optimizer(loop.optimizer, loop.model, m1), loop.loss_fn,
                          _fixed(_as_channels_last(x), y))
    elif kind == "optimizer":
        over = {"fused": True, "foreach": False} if loop.device.type == "cuda" else {"foreach": True}
        after = make_step(m0, new_optimizer(loop.optimizer, loop.model, m0, **over), loop.loss_fn,
                          _fixed(*loop.make_batch(loop.batch_size)))
    elif kind in ("launch_bound", "elementwise"):
        m1 = copy.deepcopy(loop.model)
        after = make_step(torch.compile(m1), new_optimizer(loop.optimizer, loop.model, m1), loop.loss_fn,
                          _fixed(*loop.make_batch(loop.batch_size)))
    else:
        raise ValueError(f"no fix of kind {kind!r} can be tried")
    return before, after, extra


def loaders(loader: Any, device: torch.device, workers: int) -> tuple[Any, Any]:
    """Endless copies of the user's DataLoader (one epoch's end would restart its workers mid-window): as given,
    and with `workers` workers, pinned memory (on a GPU) and persistent workers."""
    from ..dataloading import endless_loader

    if not isinstance(loader, torch.utils.data.DataLoader):
        raise TypeError("the loader is not a torch DataLoader: gpulab cannot add workers to it")
    same = dict(batch_size=loader.batch_size, collate_fn=loader.collate_fn, drop_last=loader.drop_last)
    given = endless_loader(loader.dataset, num_workers=loader.num_workers, pin_memory=loader.pin_memory,
                           prefetch_factor=loader.prefetch_factor, persistent_workers=loader.num_workers > 0, **same)
    faster = endless_loader(loader.dataset, num_workers=workers,
                            pin_memory=device.type == "cuda", persistent_workers=True, **same)
    return given, faster


def loader_trial(loop: Loop, ev: dict[str, Any], seconds: float) -> Any:
    """The step fed by the user's loader against the same loader with workers and pinned memory, both timed as
    pipelines (`tools.feeds.compare_feeds`): each window starts on a settled queue and a rate is samples over a
    window's wall time. Timed step by step, a queue the workers filled while the other side ran made most steps
    look instant (on the H200: 53x from eight workers). The workers are those the finding's fix names."""
    from ..dataloading import workers
    from ..feeds import Feed, compare_feeds
    from .rules import suggested_workers

    given, faster = loaders(loop.loader, loop.device, suggested_workers(ev.get("cores")))
    model = copy.deepcopy(loop.model)
    step = fed_step(model, new_optimizer(loop.optimizer, loop.model, model), loop.loss_fn)
    plan = trial_plan(seconds, float(ev.get("step_ms") or 0.0) / 1e3)
    with Feed(given, step, loop.device) as before, Feed(faster, step, loop.device) as after:
        return compare_feeds(before, after, 1, name="diagnose: data_wait", items=given.batch_size,
                             before_label=f"your loader ({workers(given.num_workers)})",
                             after_label=workers(faster.num_workers) + (", pinned memory" if faster.pin_memory else ""),
                             min_time_s=plan["min_time_s"], window_s=plan["round_s"], rounds=plan["rounds"],
                             min_rounds=2, budget_s=seconds / 3,  # the last pair of rounds starts by then
                             max_window_s=2 * max(plan["min_time_s"], plan["round_s"]), progress=False)


def untried(kind: str, loop: Loop | None, seconds_left: float) -> str | None:
    """Why `kind`'s fix is not tried here, or None when it can be."""
    if loop is None:
        return "a bare step: gpulab cannot change it (pass model, make_batch and loss_fn to have fixes tried)"
    gpu = loop.device.type == "cuda"
    if kind in ("sync", "attention"):
        return None  # these say why themselves: the change is in the user's code
    if kind in ("fp32_matmul", "layout") and not gpu:
        return "needs a GPU: tensor cores and cuDNN's layouts"
    if kind in ("launch_bound", "elementwise") and (not gpu or seconds_left < COMPILE_MIN_S):
        return ("not tried: torch.compile's first compile takes tens of seconds, "
                + ("and needs a GPU to pay off here" if not gpu else f"over the {seconds_left:.0f} s left"))
    if kind == "data_wait" and loop.loader is None:
        return "no loader given"
    return None


def slower_reason(kind: str, ev: dict[str, Any]) -> str:
    """What the evidence says about a fix that made the step slower."""
    launch = float((ev.get("idle") or {}).get("host_launching") or 0.0)
    if kind == "fp32_matmul" and launch >= 0.1:
        return (f"the step is launch-bound (GPU idle {launch:.0%} while the host launches): autocast adds cast "
                "kernels to a host that is already the bottleneck")
    return {"fp32_matmul": "the casts cost more than the tensor cores save at this size",
            "layout": "channels_last adds conversions around ops that have no NHWC kernel",
            "small_batch": "the GPU was already full: a bigger batch only costs memory",
            "optimizer": "the fused kernel's fixed cost outweighs the loop at this parameter count",
            "data_wait": "the workers share the host's cores with the step, and copying batches between processes "
                         "costs more than the decode they hide",
            }.get(kind, "recompiles or graph breaks cost more than the fusion wins")


MAX_ROUNDS = 5  # five interleaved pairs: their range holds the median ratio 94% of the time (two pairs: 50%)


def trial_plan(seconds: float, step_s: float) -> dict[str, Any]:
    """How a trial of about `seconds` spends them, given the step's time: a third on the two main windows, the rest
    on interleaved rounds, as many as fit (2 to MAX_ROUNDS), each side's round at least four steps (one warm-up).
    Two rounds give two pair ratios, whose range holds the median only half the time: on the H200 a GPT-2's BF16
    trial read 3.94x [3.937, 3.939] from two."""
    round_s = max(seconds / (3 * MAX_ROUNDS), 4 * step_s)
    rounds = max(2, min(MAX_ROUNDS, int(seconds * 2 / 3 / (2 * round_s))))
    return {"min_time_s": seconds / 6, "rounds": rounds, "round_s": round_s}


def measure(kind: str, loop: Loop, ev: dict[str, Any], seconds: float) -> tuple[dict[str, Any] | None, str, Any]:
    """Try `kind`'s fix within about `seconds`: (gain dict, why, the gl.Comparison); gain and comparison None,
    with the reason, where it failed."""

    before = after = cmp = None
    step_s = float(ev.get("step_ms") or 0.0) / 1e3
    try:
        if kind == "data_wait":
            cmp = loader_trial(loop, ev, seconds)
        else:
            before, after, extra = pair(loop, kind)
            grown = extra.get("after_items", loop.batch_size) / loop.batch_size  # the fix's step does this much more
            cmp = before_after(before, after, name=f"diagnose: {kind}", monitor=False, progress=False,
                               **trial_plan(seconds, step_s * grown), **extra)
        h = cmp.headline()
        gain = {"value": h.value, "lo": h.lo, "hi": h.hi, "verdict": cmp.verdict, "basis": cmp.basis}
    except torch.cuda.OutOfMemoryError:
        gain, why = None, "the fix ran out of GPU memory"
    except Exception as e:  # a fix this model cannot take is reported, not raised
        gain, why = None, f"the fix failed on this model: {type(e).__name__}: {str(e)[:160]}"
    else:
        why = slower_reason(kind, ev) if h.hi < 1.0 else ""  # gain_text says "within noise" itself
    del before, after  # the copies go before the next trial allocates its own
    gc.collect()
    if loop.device.type == "cuda":
        torch.cuda.empty_cache()
    return gain, why, cmp
