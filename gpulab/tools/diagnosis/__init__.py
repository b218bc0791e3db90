"""`gl.diagnose`: what slows a training step, the fix as code, the lesson that explains it, and the fix measured.

    diag = gl.diagnose(model, make_batch, loss_fn, batch_size=32, optimizer=opt)   # or gl.diagnose(step_fn)
    diag.findings[0].kind, diag.findings[0].gain, diag.to_dict()

Evidence (evidence.py) -> rules with stated thresholds (rules.py) -> fixes tried on copies (trials.py) -> a ranked
Diagnosis (report.py). The model, the optimizer, the RNG and torch's global precision settings are restored.
"""
from __future__ import annotations

import contextlib
import time
from typing import Any, Callable, Iterator

import torch

from .report import Diagnosis, Finding, rank
from .rules import CPU_NOTES, findings as apply_rules

__all__ = ["diagnose", "Diagnosis", "Finding"]
TRIED = ("small_batch", "fp32_matmul", "layout", "optimizer", "data_wait", "launch_bound", "elementwise")


@contextlib.contextmanager
def preserved(model: torch.nn.Module | None, optimizer: torch.optim.Optimizer | None) -> Iterator[None]:
    """Put back, on the way out, the model's and optimizer's state, the grads, the RNG and torch's precision flags."""
    import copy

    flags = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32,
             torch.get_float32_matmul_precision(), torch.backends.cudnn.benchmark)
    rng = torch.get_rng_state()
    cuda_rng = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
    weights = {k: v.detach().clone() for k, v in model.state_dict().items()} if model is not None else None
    params = list(model.parameters()) if model is not None else []
    grads = [None if p.grad is None else p.grad.detach().clone() for p in params]
    opt_state = copy.deepcopy(optimizer.state_dict()) if optimizer is not None else None
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = flags[:2]
        torch.set_float32_matmul_precision(flags[2])
        torch.backends.cudnn.benchmark = flags[3]
        torch.set_rng_state(rng)
        if cuda_rng is not None:
            torch.cuda.set_rng_state_all(cuda_rng)
        if model is not None:
            model.load_state_dict(weights)
            for p, g in zip(model.parameters(), grads):
                p.grad = g
        if optimizer is not None:
            optimizer.load_state_dict(opt_state)


def _check(model: Any, make_batch: Any, loss_fn: Any, batch_size: Any, optimizer: Any, loader: Any,
           try_fixes: Any, budget_s: Any) -> bool:
    """Every argument checked before any work; True for the model form, False for a bare step."""
    from ...measuring import checks

    if not isinstance(try_fixes, bool):
        raise ValueError(f"try_fixes={try_fixes!r} must be True or False")
    checks.positive_float("budget_s", budget_s)
    if not isinstance(model, torch.nn.Module):
        if not callable(model):
            raise ValueError(f"model={model!r} must be an nn.Module (with make_batch and loss_fn) or a callable step")
        if any(v is not None for v in (make_batch, loss_fn, batch_size, optimizer, loader)):
            raise ValueError("a bare step_fn takes no make_batch, loss_fn, batch_size, optimizer or loader: "
                             "pass an nn.Module as the first argument to give them")
        return False
    for name, fn in (("make_batch", make_batch), ("loss_fn", loss_fn)):
        if not callable(fn):
            raise ValueError(f"{name}={fn!r} must be callable: make_batch(batch_size) -> (inputs, targets), "
                             "loss_fn(output, targets) -> loss")
    if next(model.parameters(), None) is None:
        raise ValueError("model has no parameters: there is no training step to diagnose")
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size <= 0:
        raise ValueError(f"batch_size={batch_size!r} must be an int > 0 (the samples in one step)")
    if optimizer is not None and not isinstance(optimizer, torch.optim.Optimizer):
        raise ValueError(f"optimizer={optimizer!r} must be a torch.optim.Optimizer or None (AdamW stands in)")
    if loader is not None and not hasattr(loader, "__iter__"):
        raise ValueError(f"loader={loader!r} must be an iterable of (inputs, targets) CPU batches, or None")
    return True


def diagnose(model: torch.nn.Module | Callable[[], Any], make_batch: Callable[[int], Any] | None = None,
             loss_fn: Callable[[Any, Any], Any] | None = None, *, batch_size: int | None = None,
             optimizer: torch.optim.Optimizer | None = None, loader: Any = None, try_fixes: bool = True,
             budget_s: float = 170.0, progress: bool = True) -> Diagnosis:
    """Name what slows a training step, with the fix as code and its lesson; with `try_fixes`, time each fix
    gpulab can apply itself on copies (`gl.before_after`), within `budget_s` seconds in all."""
    from tqdm.auto import tqdm

    from . import evidence as E
    from . import trials as T

    full = _check(model, make_batch, loss_fn, batch_size, optimizer, loader, try_fixes, budget_s)
    t0 = time.perf_counter()
    if full:
        device = next(model.parameters()).device
        loop = T.Loop(model, optimizer, make_batch, loss_fn, batch_size, device, loader)
    else:
        device = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
        loop = None
    bar = tqdm(total=5 + (len(TRIED) if try_fixes else 0), desc="diagnose", leave=False, disable=not progress)

    def tick(what: str) -> None:
        bar.set_postfix_str(what)
        bar.update(1)

    with preserved(model if full else None, optimizer):
        if full:
            opt = optimizer or torch.optim.AdamW(model.parameters(), lr=1e-4)
            feed = E.BatchSource(loader, device) if loader is not None else None
            step = T.make_step(model, opt, loss_fn, feed.next if feed else T._fixed(*make_batch(batch_size)))
        else:
            opt, feed, step = None, None, model
        ev = E.collect(step, device=device, model=model if full else None, optimizer=opt,
                       batch_size=batch_size, feed=feed, tick=tick)
        if full and optimizer is None:
            ev["optimizer_note"] = "no optimizer given: torch's default AdamW stood in"
    found, needs_gpu = apply_rules(ev)
    notes = [] if ev["gpu"] else list(CPU_NOTES)
    if not full:
        notes.append("a bare step: fixes that need the model (batch, autocast, layout, compile) cannot be tried")
    comparisons = _try(found, loop, ev, t0 + budget_s, tick) if try_fixes else {}
    bar.close()
    return Diagnosis(findings=rank(found), evidence=ev, needs_gpu=needs_gpu, notes=notes,
                     seconds=time.perf_counter() - t0, comparisons=comparisons)


COMPILED = ("launch_bound", "elementwise")  # one torch.compile trial serves both
COMPILE_S = 60.0  # what a first compile of a training step may take, kept out of that trial's timed seconds


def trial_order(found: list[Finding]) -> list[Finding]:
    """Trials by expected value for their cost: the larger share first, torch.compile's (tens of seconds of
    compiling before it times anything) last, so the budget runs out on what it buys least of."""
    return sorted(found, key=lambda f: (f.kind in COMPILED, -f.share))


def trial_seconds(todo: list[Finding], left: float) -> float:
    """Seconds for the first of `todo`'s trials: an equal part of those left (30 at most), keeping torch.compile's
    minimum back for a compile trial still to come where the others can do with 8 s each (then 20 at most)."""
    from .trials import COMPILE_MIN_S

    cheap = sum(1 for f in todo if f.kind not in COMPILED)
    if todo[0].kind not in COMPILED and cheap < len(todo) and left - COMPILE_MIN_S >= 8.0 * cheap:
        return min(20.0, (left - COMPILE_MIN_S) / cheap)
    if todo[0].kind in COMPILED:  # its first call compiles (tens of seconds) before anything is timed
        return min(30.0, max(8.0, left - COMPILE_S) / len(todo))
    return min(30.0, left / len(todo))


def _try(found: list[Finding], loop: Any, ev: dict[str, Any], deadline: float,
         tick: Callable[[str], None]) -> dict[str, Any]:
    """Measure each finding's fix (one compile shared by launch_bound and elementwise), each within its share of
    the seconds left; return each measured kind's gl.Comparison."""
    from . import trials as T

    todo = trial_order([f for f in found if f.kind in TRIED])
    done: dict[str, tuple[Any, str, Any]] = {}
    comparisons: dict[str, Any] = {}
    for i, f in enumerate(todo):
        left = deadline - time.perf_counter()
        key = "compile" if f.kind in COMPILED else f.kind
        why = T.untried(f.kind, loop, left)
        if why is None and key not in done and left > 2.0:
            tick(f"trying: {f.kind}")
            done[key] = T.measure(f.kind, loop, ev, trial_seconds(todo[i:], left))
        elif why is None and key not in done:
            why = "not tried: the time budget is spent"
        if why is not None:
            f.why = f.why or why
        else:
            f.gain, f.why, cmp = done[key]
            if cmp is not None:
                comparisons[f.kind] = cmp
    for f in found:
        if f.kind not in TRIED and loop is None and not f.why:
            f.why = T.untried(f.kind, None, 0.0) or ""
    return comparisons
