"""Notebook 01's claims as data (gl.lesson's ClaimSpec dicts, with what each needs), and the evidence for each:
small functions that turn what the notebook measured into (value with its interval, note), or (None, why not).

    lesson.check("window", *mc.window(period))       # judged on the interval; "not tested" with the reason if None
"""
from __future__ import annotations

from typing import Any, Sequence

from ..claims import Estimate, difference
from .measuring_lab import gpm_estimate, samples_estimate
from .measuring_lesson import pct

_SRC = "guide §1.1"
_TABLE = "guide §1.2 MFU table"
CLAIMS = [
    dict(key="kernels_active", text="GPU Utilization: percentage of time GPU had active kernels (NVML vs "
         "kernel-active share, points)", low=-10, high=10, unit="points", source=_SRC, needs=("cuda",)),
    dict(key="memory_util", text="Memory Utilization: percentage of memory bandwidth used (NVML memory util minus "
         "GPM DRAM bandwidth)", low=-10, high=10, unit="points", source=_SRC, needs=("cuda",)),
    dict(key="window", text="nvidia-smi utilization averages over 1-second windows", low=0.9, high=1.1, unit="s",
         source=_SRC, needs=("cuda",)),
    dict(key="bursts", text="Sampling-based: misses short bursts (share of the bursts' busy time NVML reports)",
         high=0.5, unit="x", source=_SRC, needs=("cuda",)),
    dict(key="compute_types", text="Doesn't distinguish compute types: FP32 vs tensor-core matmul, NVML busy "
         "difference (points)", low=-10, high=10, unit="points", source=_SRC, needs=("cuda",)),
    dict(key="target_util", text="Target: 90%+ GPU utilization (the optimised training loop)", low=90, unit="%",
         source=_SRC, needs=("cuda",)),
    dict(key="target_mem", text="Target: 70%+ memory utilization (the optimised training loop)", low=70, unit="%",
         source=_SRC, needs=("cuda",)),
    dict(key="raw_matmul", text="Raw matmuls: 70-80% MFU achievable", low=70, unit="%",
         source="000_ summary (Medium MFU article)", needs=("cuda",)),
    dict(key="good_training", text="40-60% MFU: good transformer training (the course's optimised loop)", low=40,
         high=60, unit="%", source=_TABLE, needs=("cuda", "full")),
    dict(key="no_sync", text="Timing without synchronize measures the launch, not the work (events / no-sync host "
         "clock)", low=2, unit="x", source="DESIGN: measuring honestly; the guide's MFUTracker (§1.2) syncs for this "
         "reason", needs=("cuda",)),
    dict(key="gpt2_formula", text="GPT-2 small, batch 32 × 1024: ~1.7 TFLOPs per step (by the guide's own formula)",
         low=1.5, high=1.9, unit="TFLOP", source="guide §1.2", evidence="arithmetic"),
    dict(key="gpt2_counted", text="GPT-2 small, batch 32 × 1024: ~1.7 TFLOPs per training step (FlopCounterMode)",
         low=1.5, high=1.9, unit="TFLOP", source="guide §1.2", evidence="arithmetic"),
    dict(key="mfu_example", text="1.7e12 FLOPs in 0.5 s on a 312 TFLOP/s A100 is 1.09% MFU", low=1.085, high=1.095,
         unit="%", source="guide §1.2", evidence="arithmetic"),
    # Other systems' MFU: our optimised loop stands beside them as a proxy.
    dict(key="llama", text="Llama 3 405B: 38-41% MFU", low=38, high=41, unit="%",
         source="000_ summary (Medium MFU article)"),
    dict(key="deepseek", text="DeepSeek-v3: 20-30% MFU (communication bottleneck)", low=20, high=30, unit="%",
         source="000_ summary"),
    dict(key="excellent", text="50-60% MFU is excellent for transformers (communication overhead)", low=50, high=60,
         unit="%", source="guide overview (Modal)"),
    # Labels for ranges, and claims about tools or fleets this course does not measure.
    dict(key="range_1_5", text="1-5% MFU: severe bottleneck (data loading, small batch, CPU sync)", low=1, high=5,
         unit="%", source=_TABLE),
    dict(key="range_10_30", text="10-30% MFU: poor optimization (missing mixed precision, inefficient kernels)",
         low=10, high=30, unit="%", source=_TABLE),
    dict(key="range_60_80", text="60-80% MFU: excellent for CNNs or single-GPU training", low=60, high=80, unit="%",
         source=_TABLE),
    dict(key="range_80", text="80%+ MFU: exceptional (rare, requires perfect conditions)", low=80, unit="%",
         source=_TABLE),
    dict(key="serverless", text="90%+ GPU allocation utilization achievable with serverless", low=90, unit="%",
         source="000_ summary (Modal)"),
    dict(key="dcgm", text="DCGM: dcgmi dmon -e 1004 reads tensor-core activity (DCGM_FI_PROF_PIPE_TENSOR_ACTIVE)",
         low=0, high=100, unit="%", source="guide §1.3"),
]
NOT_COMPARABLE = {"llama": "thousands of GPUs, another model", "deepseek": "a cluster, another model",
                  "excellent": "multi-GPU training with communication"}
_RANGE = ("a label for a range of MFU, not a prediction about a workload; notebook 08's waterfall shows loops across "
          "these ranges")
UNTESTABLE = {"range_1_5": _RANGE, "range_10_30": _RANGE, "range_60_80": _RANGE, "range_80": _RANGE,
              "serverless": "a fleet-scheduling figure: one GPU in one process cannot measure allocation across users",
              "dcgm": "the DCGM tools are not part of this course; the same counters are read above through NVML's "
                      "GPM interface"}


Evidence = tuple[Any, str]  # (an Estimate, Comparison or number; or None) and the note, or the reason it is None


def kernels_active(run_py: Any, cmp_launch: Any) -> Evidence:
    """NVML's busy over the Python loop minus the share of its time kernels can have been running (graph / loop)."""
    nvml = samples_estimate(run_py.trace, "nvml_util")
    if nvml is None:
        return None, "needs a CUDA GPU with NVML"
    active = cmp_launch.estimate().map(lambda s: 100 / s)  # % of the loop's time with a kernel running, at most
    return difference(nvml, active), (f"tiny matmuls from Python: NVML {run_py.metric('nvml_util'):.1f}%, kernels "
                                      f"active at most {active.value:.1f}% of the time (graph time / loop time)")


def memory_util(watch_big: Any, big_n: int) -> Evidence:
    """utilization.memory minus GPM's DRAM bandwidth, over one clean window of the big matmul back to back."""
    mem, dram = samples_estimate(watch_big, "nvml_mem_util"), gpm_estimate(watch_big, "gpm_dram_bw")
    if mem is None or dram is None:
        return None, "needs NVML and GPM (a Hopper or newer GPU) to compare with the bandwidth actually used"
    return difference(mem, dram), (f"{big_n}³ matmul, 2 s back to back: utilization.memory {mem.value:.1f}%, DRAM "
                                   f"bandwidth used {dram.value:.1f}% (GPM)")


def window(period: Estimate | None) -> Evidence:
    """The spacing of NVML's buffered samples."""
    if period is None:
        return None, "needs a CUDA GPU with NVML utilization samples"
    return period, "spacing of NVML's buffered utilization samples during our runs (median, quartiles)"


def bursts(captured: Estimate | None, runs: Sequence[Any]) -> Evidence:
    """The share of the bursts' busy time NVML reported ("misses" read as: at most half of it shows up)."""
    if captured is None:
        return None, "needs a CUDA GPU with NVML utilization samples (the burst test)"
    return captured, ("; ".join(f"{b.burst_ms:g} ms bursts every {b.burst_ms + b.gap_ms:g} ms: GPU busy "
                                f"{b.true_busy_pct:.1f}%, NVML {b.nvml_pct:.1f}%, {b.missed_periods} of "
                                f"{len(b.periods)} periods read 0%" for b in runs)
                      + "; tested: gaps under one sample period, not an isolated burst")


def compute_types(watch_fp32: Any, watch_big: Any, dtype: str) -> Evidence:
    """NVML busy of the tensor-core matmul minus that of the FP32 one, each 2 s back to back."""
    a, b = samples_estimate(watch_big, "nvml_util"), samples_estimate(watch_fp32, "nvml_util")
    if a is None or b is None:
        return None, "needs a CUDA GPU with NVML"
    return difference(a, b), (f"2 s back to back each: NVML FP32 {watch_fp32.mean('nvml_util'):.1f}% vs "
                              f"{dtype.upper()} {watch_big.mean('nvml_util'):.1f}%; GPM tensor active "
                              f"{pct(watch_fp32.mean('gpm_tensor_active'))} vs "
                              f"{pct(watch_big.mean('gpm_tensor_active'))}")


def target_util(opt_nvml: Estimate | None, run_graph: Any) -> Evidence:
    """A target, read as "a well-optimised training loop keeps NVML at 90%+", tested on ours."""
    if opt_nvml is None:
        return None, "needs a CUDA GPU with NVML"
    return opt_nvml, (f"NVML samples over the optimised loop's timed steps; the same target is met by the CUDA graph "
                      f"of tiny matmuls ({pct(run_graph.metric('nvml_util'))} busy at {pct(run_graph.mfu, 100, 3)} "
                      "MFU): reaching it says nothing about useful work")


def target_mem(opt_step: Any, run_big: Any) -> Evidence:
    """utilization.memory over the optimised loop's timed steps."""
    mem = samples_estimate(opt_step.run.trace, "nvml_mem_util")
    if mem is None:
        return None, "needs a CUDA GPU with NVML"
    return mem, ("NVML utilization.memory over the optimised loop's timed steps; a compute-bound step need not reach "
                 f"it (the big matmul read {pct(run_big.metric('nvml_mem_util'))})")


def raw_matmul(device: Any, peaks: Any, dtype: str) -> Evidence:
    """The sustained matmul peak over the datasheet's ("achievable" is a floor); interval: the timed rounds."""
    ds = device.datasheet_tflops(dtype)
    if not (device.is_cuda and ds and dtype in peaks.tflops):
        return None, "needs a CUDA GPU with a datasheet peak; on a CPU there is no tensor-core peak to compare with"
    best = peaks.tflops[dtype]
    rounds = (peaks.rounds.get(dtype) or [best]) + [best]
    return Estimate(100 * best / ds, 100 * min(rounds) / ds, 100 * max(rounds) / ds), (
        f"{peaks.matmul_size}³ {dtype} matmul, sustained: {best:,.0f} of {ds:g} TFLOP/s (datasheet); interval: the "
        f"{len(rounds) - 1} timed rounds")


def good_training(opt_mfu: Estimate | None, opt_step: Any, eager: Any, note: str) -> Evidence:
    """The optimised loop's MFU against the datasheet dense BF16 peak; interval: step-time quartiles."""
    from .. import training as T

    if opt_mfu is None:
        return None, ("needs a CUDA GPU with a datasheet peak at full size (the optimised loop at smoke size on a CPU "
                      "says nothing about it); see the reference run")
    m = opt_step.config.model
    return opt_mfu, (f"{T.describe(opt_step.config)}; GPT {m.n_layer}×{m.n_embd}, {opt_step.config.tokens_per_step:,} "
                     "tokens per step; 6N + 12·L·H·Q·T FLOPs over the datasheet dense BF16 peak; interval: step-time "
                     f"quartiles. {note}The eager step above read {pct(eager.mfu, 100)}")


def gpt2_markdown(ex: dict[str, tuple[float, float]]) -> str:
    """What the recomputed GPT-2 example says about the guide's 1.7 TFLOP and its 1.09% MFU."""
    from ..flops import mfu

    guide_fwd, fc_train = ex["guide §1.2 formula"][0], ex["FlopCounterMode (meta device)"][1]
    return (f"The guide's formula, evaluated as printed, gives {guide_fwd / 1e12:.2f} TFLOP for a *forward* pass, not "
            f"1.7. A training step is about 3x forward: FlopCounterMode counts {fc_train / 1e12:.1f} TFLOP and "
            f"6N + 12·L·H·Q·T gives {ex['6N + 12·L·H·Q·T'][1] / 1e12:.1f}. The worked MFU arithmetic is right for its "
            f"inputs, but with a training step's FLOPs the same 0.5 s step on an A100 would be "
            f"{100 * mfu(fc_train, 0.5, 312):.0f}% MFU, not {100 * mfu(1.7e12, 0.5, 312):.2f}%: the guide's \"very "
            f"low! needs optimization\" comes from a FLOP count {fc_train / 1.7e12:.0f}x too small.")


def record_the_rest(lesson: Any, proxy: Estimate | None) -> None:
    """Other systems' MFU figures beside our proxy (not comparable); labels and tools this course does not test."""
    beside = "beside it: our optimised GPT-2-small loop on one GPU (MFU, % of the BF16 datasheet peak)"
    for key, system in NOT_COMPARABLE.items():
        lesson.not_comparable(key, proxy, f"{system}; {beside}" if proxy else
                              f"{system}; no proxy measured here (needs a GPU at full size)")
    for key, why in UNTESTABLE.items():
        lesson.untested(key, why)
