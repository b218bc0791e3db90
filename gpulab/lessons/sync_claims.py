"""Notebook 04's claims as data (guide §4, and the review fixes it cites), and the functions that judge each one on
what the notebook measured: the loops' speedups with their intervals, the syncs counted by
`torch.cuda.set_sync_debug_mode`, the host-to-device copies and the two-stream overlap.

    display(*check_item(lesson, cmp_twice, cmp_item))   # each claim recorded with its verdict

Timing claims are checked on a CUDA GPU only: on a CPU there is no queue of GPU work to drain, so a sync costs
nothing. Sync counts need CUDA too: the debug mode reports nothing on a CPU. Nothing here times anything except the
sync counts of `.numpy()` and of a dynamic allocation, which the claims need on a GPU.
"""
from __future__ import annotations

from typing import Any, Callable

from .. import profiling
from ..claims import Claim, Estimate

__all__ = ["CLAIMS", "NOT_GPU", "NO_DEBUG_MODE", "SYNC_VARIANTS", "pct_faster", "check_gpu", "check_item",
           "check_eval", "check_zero_grad", "check_syncs", "check_numpy_int", "check_copies", "check_overlap"]

NOT_GPU = "needs a CUDA GPU; see the reference run"
NO_DEBUG_MODE = "needs CUDA: set_sync_debug_mode only reports on a GPU"
_CUDA = ("cuda",)
_S41 = "guide §4.1"

# Timing claims read "x% faster" off a before/after; sync claims are exact counts (one warning per synchronizing
# call), so their interval has zero width, but they are still measured in this run. The unit of "accumulate" names
# the steps per call, set by `sync_lesson.use_sizes` once the sizes are known.
CLAIMS = [
    dict(key="item_twice", text="a single .item() per step instead of two: 2-5% faster", low=2, high=5, unit="%",
         source="optimization review (002_), fix 2", needs=_CUDA),
    dict(key="item_sync", text="eliminating the CPU-GPU sync in the training loop: 15-20% faster iterations",
         low=15, high=20, unit="%", source="guide summary (000_), optimization 3", needs=_CUDA),
    dict(key="eval", text="GPU-side accumulation of predictions: 10-15% faster evaluation", low=10, high=15,
         unit="%", source="optimization review (002_), fix 3", needs=_CUDA),
    dict(key="zero_grad", text="zero_grad(set_to_none=True): 5-10% faster per step", low=5, high=10, unit="%",
         source="optimization review (002_), fix 1", needs=_CUDA),
    dict(key="mask_sync", text="boolean-mask indexing forces a CPU-GPU sync", low=1, unit="syncs per step",
         source=_S41, needs=_CUDA),
    dict(key="where_no_sync", text="the same masked mean with torch.where stays on the GPU", high=0,
         unit="syncs per step", source="guide §4.1 (the fix)", needs=_CUDA),
    dict(key="item_forces", text=".item() forces a CPU-GPU sync", low=1, unit="syncs per step", source=_S41,
         needs=_CUDA),
    dict(key="cpu_forces", text=".cpu() forces a CPU-GPU sync", low=1, unit="syncs per step", source=_S41,
         needs=_CUDA),
    dict(key="branch_forces", text="dynamic control flow (`if tensor.sum() > 0:`) forces a CPU-GPU sync", low=1,
         unit="syncs per step", source=_S41, needs=_CUDA),
    dict(key="accumulate", text="accumulate on the GPU, log every N steps: one sync per N steps", low=1, high=1,
         unit="syncs per N steps", source="guide §4.2", needs=_CUDA),
    dict(key="logging_thread", text="a logging thread moves the .item() sync off the training loop", high=0,
         unit="syncs per logged step", source="guide §4.3", needs=_CUDA),
    dict(key="numpy", text="`.numpy()` forces a CPU-GPU sync", low=1, unit="syncs", source=_S41, needs=_CUDA),
    dict(key="int_max", text="`int(tensor.max())` for a dynamic size forces a CPU-GPU sync", low=1, unit="syncs",
         source=_S41, needs=_CUDA),
    dict(key="pinned", text="pinned memory gives faster CPU-to-GPU transfers than pageable", low=1.1, unit="x",
         source="guide §5.1-5.2", needs=_CUDA),
    dict(key="non_blocking", text="a non_blocking copy (pinned memory) returns immediately", high=10, unit="%",
         source="guide §4.2", needs=_CUDA),
    # "Only after the copy": the call returned after >= 90% of the copy's time on the GPU (the driver may still be
    # moving the last staged chunk when it returns).
    dict(key="pageable_blocks",
         text="non_blocking needs pinned memory: from pageable memory the call returns only after the copy", low=90,
         unit="%", source="guide §4.2 (\"requires pin_memory=True\")", needs=_CUDA),
    dict(key="streams", text="work on two CUDA streams runs in parallel (a copy hides behind compute)", low=80,
         unit="%", source="guide §4.2 (async operations)", needs=_CUDA),
]
# The "forces a sync" claims: (claim key, the variant of section 5's training step it is counted on).
SYNC_VARIANTS = [("mask_sync", "loss[mask].mean()"), ("where_no_sync", "torch.where masked mean"),
                 ("item_forces", ".item() once per step"), ("cpu_forces", "loss.cpu() per step"),
                 ("branch_forces", "if loss.sum() > 0: per step")]
BASELINE = "no read-back at all"  # the variant whose syncs every other one makes anyway


def pct_faster(cmp: Any) -> Estimate:
    """"x% faster" as (before time / after time - 1) * 100 (10% faster = 1.10x), with the speedup's interval."""
    return cmp.estimate().map(lambda r: (r - 1) * 100)


def check_gpu(lesson: Any, key: str, value: Any, note: str = "") -> Claim:
    """Judge a GPU-speed claim on a GPU only: on a CPU there is no queue to drain, so a sync costs nothing."""
    if not lesson.gpu:
        return lesson.untested(key, NOT_GPU)
    return lesson.check(key, value, note) if value is not None else lesson.untested(key, note or "not measured")


def _count(lesson: Any, key: str, count: Callable[[], int], note: str) -> Claim:
    # The counts exist only on a GPU (`found` is {} on a CPU), so they are read only there.
    if not lesson.gpu:
        return lesson.untested(key, NO_DEBUG_MODE)
    return lesson.check(key, count(), note)


def check_item(lesson: Any, cmp_twice: Any, cmp_item: Any) -> list[Claim]:
    """Judge section 1's two claims: one .item() instead of two, and losses summed on the GPU."""
    return [check_gpu(lesson, "item_twice", pct_faster(cmp_twice),
                      "(time with two / time with one - 1), GPT training loop"),
            check_gpu(lesson, "item_sync", pct_faster(cmp_item),
                      ".item() every step vs losses summed on the GPU, GPT training loop")]


def check_eval(lesson: Any, cmp_eval: Any, eval_batches: int) -> Claim:
    """Judge the review's fix 3: predictions kept on the GPU, one transfer at the end."""
    return check_gpu(lesson, "eval", pct_faster(cmp_eval), f"eval loop of {eval_batches} batches, GPT forward")


def check_zero_grad(lesson: Any, cmp_zero: Any) -> Claim:
    """Judge the review's fix 1: zero_grad(set_to_none=True) against writing zeros."""
    return check_gpu(lesson, "zero_grad", pct_faster(cmp_zero),
                     "set_to_none=False vs True (the default since torch 2.0), GPT training loop")


def check_syncs(lesson: Any, found: dict[str, int], logging_syncs: int | None, steps: int) -> list[Claim]:
    """Judge the "forces a sync" claims, one sync per N steps, and the guide's logging thread, each on its count
    minus the syncs a step that reads nothing back makes anyway."""
    base = found.get(BASELINE, 0)  # 0 if the step itself is sync-free
    note = f"set_sync_debug_mode('warn'), minus the {base} sync(s) of a step that reads nothing back"
    out = [_count(lesson, key, lambda v=variant: found[v] - base, note) for key, variant in SYNC_VARIANTS]
    out.append(_count(lesson, "accumulate",
                      lambda: found[f"summed on GPU, one read per {steps} steps"] - steps * base, note))
    out.append(_count(lesson, "logging_thread", lambda: logging_syncs - 2 * base,
                      "syncs on the training thread with the guide's recipe (two steps, one logged), minus those of "
                      "two plain steps"))
    return out


def check_numpy_int(lesson: Any, to_numpy: Callable[[], Any], alloc: Callable[[], Any],
                    reduce: Callable[[], Any]) -> list[Claim]:
    """Count the syncs of `.numpy()` on a GPU tensor, and of `torch.zeros(int(t.max()))` minus those of `t.max()`."""
    if not lesson.gpu:
        return [lesson.untested(k, NO_DEBUG_MODE) for k in ("numpy", "int_max")]
    try:
        c_np = lesson.check("numpy", len(profiling.find_syncs(to_numpy)), "set_sync_debug_mode('warn')")
    except TypeError as e:  # what PyTorch does with a GPU tensor: say it, do not guess a count
        first = (str(e).splitlines() or [""])[0][:100]
        c_np = lesson.untested("numpy", f"on a GPU tensor .numpy() raises {type(e).__name__} ({first}); the sync "
                                        "is the .cpu() before it, counted above")
    n_alloc, n_max = len(profiling.find_syncs(alloc)), len(profiling.find_syncs(reduce))
    return [c_np, lesson.check("int_max", n_alloc - n_max,
                               "set_sync_debug_mode('warn'): torch.zeros(int(t.max())) minus t.max()")]


def check_copies(lesson: Any, cmp_pin: Any, copy_t: dict[str, Any], copy_mb: int) -> list[Claim]:
    """Judge pinned vs pageable bandwidth, and when a non_blocking copy returns, from pinned and pageable memory."""
    def returned(label: str) -> Estimate | None:  # % of the copy's GPU time until the call returned
        return copy_t[label].fraction_estimate().map(lambda f: f * 100) if copy_t else None

    quartiles = "(median and quartiles over 10 copies)"
    return [check_gpu(lesson, "pinned", cmp_pin, f"{copy_mb} MiB copy, pinned bandwidth / pageable bandwidth"),
            check_gpu(lesson, "non_blocking", returned("pinned_non_blocking"),
                      f"time until .copy_(non_blocking=True) returned, % of the copy's time on the GPU {quartiles}"),
            check_gpu(lesson, "pageable_blocks", returned("pageable_non_blocking"),
                      "time until .copy_(non_blocking=True) from pageable memory returned, % of the copy's time on "
                      f"the GPU {quartiles}")]


def check_overlap(lesson: Any, hidden: Estimate | None) -> Claim:
    """Judge "two streams run in parallel" on the share of the shorter task the overlap hid (None: not run)."""
    return check_gpu(lesson, "streams", hidden, "share of the shorter task (copy or compute) hidden by the overlap")
