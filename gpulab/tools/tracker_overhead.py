"""What a step tracker costs: a training loop timed with and without it, interleaved, in one run
(`tracker_overhead`), gpulab's `track` beside the guide's §8.4 `GuideTracker`."""
from __future__ import annotations

import dataclasses
import gc
import math
import statistics
import time
from dataclasses import dataclass
from typing import Any, Callable

import torch

from ..measuring.estimates import Estimate, median_interval
from ..measuring.device import synchronize

__all__ = ["GuideTracker", "TRACKER_MODES", "OverheadResult", "paired_overhead", "tracker_overhead"]


class GuideTracker:
    """The guide's §8.4 PerformanceTracker as written: synchronize and read the host clock around each step."""

    def __init__(self, model_flops_per_step: float, device_peak_flops: float):
        self.model_flops, self.peak_flops = model_flops_per_step, device_peak_flops
        self.step_times: list[float] = []
        self.start_time = 0.0

    def start_step(self) -> None:
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        self.start_time = time.perf_counter()

    def end_step(self) -> dict[str, float]:
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        elapsed = time.perf_counter() - self.start_time
        self.step_times.append(elapsed)
        achieved = self.model_flops / elapsed
        return {"step_time": elapsed, "achieved_tflops": achieved / 1e12, "mfu_percent": achieved / self.peak_flops * 100,
                "samples_per_sec": 1 / elapsed}


TRACKER_MODES = ("off", "gpulab tracker", "guide §8.4 tracker")


def paired_overhead(on: list[float], off: list[float], confidence: float = 0.95) -> Estimate:
    """How much slower `on` is than `off`, in percent, from paired timings (on[i] beside off[i]).

    The median paired difference over the mean of `off`, x 100, with the distribution-free 95% interval of that
    median. Pairs share the GPU's and the host's slow drifts; the median keeps one host hiccup from swinging the
    result, which the mean did (one launch-bound loop read -6.9% [-18.3, 4.4] and +5.6% [2.1, 9.0] by the mean)."""
    if len(on) != len(off) or len(on) < 2:
        raise ValueError(f"on and off need the same length >= 2, got {len(on)} and {len(off)}")
    base = statistics.fmean(off)
    if not base > 0:
        raise ValueError("off timings must be positive")
    d = [a - b for a, b in zip(on, off)]
    mid = statistics.median(d)
    lo, hi = median_interval(d, confidence, include=mid)
    return Estimate(mid / base * 100, lo / base * 100, hi / base * 100)


@dataclass
class OverheadResult:
    """A loop's step time with and without each tracker, as paired timings (see `tracker_overhead`)."""

    loop: str
    steps_per_block: int
    steps_per_round: int
    blocks: dict[str, list[float]]  # seconds per step: "off" and "gpulab tracker", ABBA blocks without syncs
    rounds: dict[str, list[float]]  # seconds per step: "off" and "guide §8.4 tracker", synced rounds
    guide_mfu: list[float] = dataclasses.field(default_factory=list)
    tracker_mfu: list[float] = dataclasses.field(default_factory=list)
    block_timer: str = "host clock"  # what timed the blocks: "events" (CUDA events on a GPU)
    host_blocks: dict[str, list[float]] = dataclasses.field(default_factory=dict)  # the host clock's view
    own_s: list[float] = dataclasses.field(default_factory=list)  # per on block: host seconds inside tracker.step()
    guide_own_s: list[float] = dataclasses.field(default_factory=list)  # per guide round: seconds in its two calls

    @property
    def step_s(self) -> float:
        """Median seconds per step without a tracker (blocks)."""
        return statistics.median(self.blocks["off"])

    def overhead(self, mode: str) -> Estimate:
        """Percent slower with `mode` than without a tracker, with its 95% interval."""
        if mode == "gpulab tracker":
            return paired_overhead(self.blocks[mode], self.blocks["off"])
        if mode == "guide §8.4 tracker":
            return paired_overhead(self.rounds[mode], self.rounds["off"])
        raise ValueError(f"mode={mode!r}; allowed: {', '.join(TRACKER_MODES[1:])}")

    def own_cost(self, z: float = 1.96) -> Estimate:
        """The host time gpulab's tracker spends inside `step()`, per step, in percent of an untracked step, with the
        95% interval of the mean over the tracked blocks. On a launch-bound loop this *is* the overhead; on a GPU-bound
        loop the launch queue hides it."""
        if len(self.own_s) < 2:
            raise ValueError("own_s needs the tracker's time in at least 2 blocks")
        return _share(self.own_s, self.host_blocks.get("off") or self.blocks["off"], z)

    def guide_own_cost(self, z: float = 1.96) -> Estimate:
        """The host time the guide's tracker spends inside `start_step()` and `end_step()`, per step, in percent of an
        untracked synced round, with the 95% interval of the mean over its rounds.

        Mostly the wait in its two `torch.cuda.synchronize()` calls. On a loop the host paces, that wait is added to
        every step, measured call by call where the A/B of whole rounds carries the host's jitter of tens of percent."""
        if len(self.guide_own_s) < 2:
            raise ValueError("guide_own_s needs the guide tracker's time in at least 2 rounds")
        return _share(self.guide_own_s, self.rounds["off"], z)

    def to_dict(self) -> dict[str, Any]:
        est = lambda e: list(e.interval) + [e.value]  # noqa: E731
        return dataclasses.asdict(self) | {
            "overhead_pct": {m: est(self.overhead(m)) for m in TRACKER_MODES[1:]}} | (
            {"own_cost_pct": est(self.own_cost())} if len(self.own_s) > 1 else {}) | (
            {"guide_own_cost_pct": est(self.guide_own_cost())} if len(self.guide_own_s) > 1 else {})


def _share(own: list[float], base: list[float], z: float) -> Estimate:
    """The mean of `own` in percent of the mean of `base`, with a normal interval (z) on the mean of `own`."""
    b = statistics.fmean(base)
    mean = statistics.fmean(own)
    half = z * statistics.stdev(own) / math.sqrt(len(own))
    return Estimate(mean / b * 100, (mean - half) / b * 100, (mean + half) / b * 100)


def _abba(n: int) -> list[bool]:
    """n modes in ABBA order (True = on): on, off, off, on, on, off, ... so drifts cancel within each pair."""
    return [(i % 4) in (0, 3) for i in range(n)]


def tracker_overhead(step: Callable[[], Any], *, loop: str, block_steps: int, blocks: int, round_steps: int,
                     rounds: int, flops_per_step: float | None, peak_tflops: float | None,
                     make_tracker: Callable[[], Any], clock: Callable[[], float] = time.perf_counter,
                     sync: Callable[[], None] = synchronize,
                     events: Callable[[], Any] | None | str = "auto") -> OverheadResult:
    """Time `step` with and without each tracker, interleaved, in one run.

    gpulab's tracker never waits for the GPU, so it runs in `blocks` blocks of `block_steps` steps in ABBA order
    with no sync between them, one tracker on the whole time and `step()` called only in "on" blocks; each on block
    is paired with the off block beside it. The guide's tracker syncs twice per step, which would spill work across
    block edges, so it runs in `rounds` synced rounds of `round_steps` steps, alternating with untracked rounds.
    On a GPU a block is timed by CUDA events (`events`): its time on the GPU's timeline, so a tracker that starved
    the GPU would show while the host's jitter does not; the host-clock times are kept (`host_blocks`)."""
    if events == "auto":
        events = (lambda: torch.cuda.Event(enable_timing=True)) if torch.cuda.is_available() else None
    for name, v in (("block_steps", block_steps), ("blocks", blocks), ("round_steps", round_steps),
                    ("rounds", rounds)):
        if not isinstance(v, int) or v < 1:
            raise ValueError(f"{name}={v!r} must be an int >= 1")
    if blocks < 4 or blocks % 2 or rounds < 2:
        raise ValueError(f"blocks={blocks} must be even and >= 4, rounds={rounds} >= 2 (pairs to compare)")
    out = OverheadResult(loop=loop, steps_per_block=block_steps, steps_per_round=round_steps,
                         blocks={"off": [], "gpulab tracker": []}, rounds={"off": [], "guide §8.4 tracker": []})
    peak = (peak_tflops or 0) * 1e12
    gc.collect()
    was_enabled = gc.isenabled()
    gc.disable()  # a collection pause in one block and not its pair is noise, not tracker cost
    try:
        for _ in range(block_steps * 2):  # reach the steady state before the first timed block
            step()
        timed, out.host_blocks, out.own_s = _tracker_blocks(step, make_tracker, block_steps, blocks, clock, sync,
                                                             events)
        if events is not None:
            out.block_timer = "events"
        out.blocks = timed
        clean = make_tracker().start()  # the MFU it reports: a run where every step is tracked
        for _ in range(8 * block_steps):  # the loop is warm: every window counts
            step()
            clean.step()
        clean.stop()
        mfu = clean.summary().get("mfu_window")
        if mfu is not None:
            out.tracker_mfu.append(mfu)
        out.rounds, out.guide_mfu, out.guide_own_s = _guide_rounds(step, round_steps, rounds, flops_per_step, peak,
                                                                   clock, sync)
    finally:
        if was_enabled:
            gc.enable()
    return out


def _tracker_blocks(step: Callable[[], Any], make_tracker: Callable[[], Any], block_steps: int, blocks: int,
                    clock: Callable[[], float], sync: Callable[[], None], events: Callable[[], Any] | None
                    ) -> tuple[dict[str, list[float]], dict[str, list[float]], list[float]]:
    """Seconds per step of ABBA blocks with gpulab's tracker on and off, one tracker running throughout:
    (times by `events` around each block, or by the host clock without them; times by the host clock;
    per on block, the host seconds per step spent inside `tracker.step()`)."""
    tr = make_tracker().start()
    host: dict[bool, list[float]] = {True: [], False: []}
    own: list[float] = []
    marks = []
    for on in _abba(blocks):
        t0 = clock()
        if events is not None:
            marks.append((on, events(), events()))
            marks[-1][1].record()
        inside = 0.0
        for _ in range(block_steps):
            step()
            if on:
                c0 = clock()
                tr.step()
                inside += clock() - c0
        if events is not None:
            marks[-1][2].record()
        host[on].append((clock() - t0) / block_steps)
        if on:
            own.append(inside / block_steps)
    sync()
    tr.stop()
    timed = host
    if events is not None:  # each block's time on the GPU's own timeline, idle gaps included
        timed = {True: [], False: []}
        for on, start, end in marks:
            timed[on].append(start.elapsed_time(end) / 1e3 / block_steps)

    def named(d: dict[bool, list[float]]) -> dict[str, list[float]]:
        return {"gpulab tracker": d[True], "off": d[False]}
    return named(timed), named(host), own


def _guide_rounds(step: Callable[[], Any], round_steps: int, rounds: int, flops_per_step: float | None,
                  peak: float, clock: Callable[[], float], sync: Callable[[], None]
                  ) -> tuple[dict[str, list[float]], list[float], list[float]]:
    """Seconds per step of synced rounds with the guide's tracker and without, alternating; the MFU the
    guide's tracker reports at the end of each of its rounds; and per tracked round, the host seconds per step
    spent inside its `start_step()` and `end_step()`."""
    times: dict[str, list[float]] = {"off": [], "guide §8.4 tracker": []}
    mfus, own = [], []
    for guided in _abba(2 * rounds):
        sync()
        t0 = clock()
        if guided:
            gt = GuideTracker(flops_per_step or 1.0, peak or 1.0)
            inside = 0.0
            for _ in range(round_steps):
                c0 = clock()
                gt.start_step()
                inside += clock() - c0
                step()
                c0 = clock()
                m = gt.end_step()
                inside += clock() - c0
            own.append(inside / round_steps)
        else:
            for _ in range(round_steps):
                step()
        sync()
        times["guide §8.4 tracker" if guided else "off"].append((clock() - t0) / round_steps)
        if guided and peak:
            mfus.append(m["mfu_percent"] / 100)
    return times, mfus, own
