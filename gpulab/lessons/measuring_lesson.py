"""Notebook 01's scaffolding: its sizes and claims as data, the tables, figures and sentences that report what it
measured, and the small steps it shows with `inspect.getsource` (the host-clock timer, the three FLOP counts).

The measuring itself stays in the notebook and in `gpulab.lessons.measuring_lab`; nothing here times anything except
`host_clock` (the lesson's wrong-on-purpose timer) and the optimised loop's `measure_optimised` wrapper.
"""
from __future__ import annotations

import time
import warnings
from typing import Any, Callable, Sequence

from ..claims import Estimate

# Sizes: full on a CUDA GPU, smoke with SMOKE=True or without a GPU (gl.lesson picks and records which).
FULL = dict(BIG_N=4096, TINY_SIZE=128, TIMING_N=8192, GPT_LAYERS=12, GPT_WIDTH=768, GPT_HEADS=12, GPT_SEQ=1024,
            GPT_BATCH=8, MIN_TIME_S=1.0, OPT_BATCH=32, OPT_GRAD_ACCUM=2, OPT_WORKERS=4, OPT_COMPILE=True,
            OPT_SECONDS=2.0, BURSTS=[(1, 9), (2, 38), (10, 40)], BURST_SECONDS=2.0)
SMOKE = dict(BIG_N=64, TINY_SIZE=16, TIMING_N=256, GPT_LAYERS=2, GPT_WIDTH=64, GPT_HEADS=2, GPT_SEQ=64,
             GPT_BATCH=4, MIN_TIME_S=0.05, OPT_BATCH=4, OPT_WORKERS=1, OPT_COMPILE=False, OPT_SECONDS=0.05)

FIELDS = [("nvml_util", "utilization.gpu (%)"), ("nvml_mem_util", "utilization.memory (%)"),
          ("mem_used_gb", "memory.used (GB)"), ("power_w", "power.draw (W)"), ("sm_clock_mhz", "clocks.sm (MHz)"),
          ("gpm_sm_active", "SM active, GPM (%)"), ("gpm_tensor_active", "tensor active, GPM (%)"),
          ("gpm_dram_bw", "DRAM bandwidth, GPM (%)")]


def pct(x: float | None, scale: float = 1.0, nd: int = 1) -> str:
    """A percentage for prose, "n/a" for a reading this machine does not have."""
    return "n/a" if x is None else f"{x * scale:.{nd}f}%"


def quiet_cpu_warnings(device: Any) -> None:
    """Silence warnings that only mean "this is a CPU": empty GPU panels, and a noisy smoke timing beating the
    measured "peak"."""
    warnings.filterwarnings("ignore", message="No artists with labels found")
    if not device.is_cuda:
        warnings.filterwarnings("ignore", message="MFU .* is over 100%")


def tiny_count(big_n: int, tiny_size: int) -> int:
    """How many tiny_size³ matmuls do the FLOPs of one big_n³ matmul ((big_n / tiny_size)³)."""
    if big_n % tiny_size:
        raise ValueError(f"BIG_N={big_n} must be a multiple of TINY_SIZE={tiny_size} (equal FLOPs on both sides)")
    return (big_n // tiny_size) ** 3


def source(fn: Callable[..., Any]) -> Any:
    """A function's source, displayed as highlighted code in a notebook."""
    import inspect

    from IPython.display import Code
    return Code(inspect.getsource(fn), language="python")


def _show() -> None:
    import matplotlib.pyplot as plt
    plt.show()


# ---------------------------------------------------------------- section 2: four workloads, one monitor


def fields_html(workloads: dict[str, tuple[Any, Any]]) -> str:
    """Every nvidia-smi field (and time, TFLOP/s, MFU) for each workload: {name: (RunResult or None, Trace)}."""
    def cell(v, fmt="{:,.1f}"):
        return "n/a" if v is None else fmt.format(v)

    def per_run(fn):
        return ["—" if r is None else fn(r) for r, _ in workloads.values()]

    rows = [[label] + [cell(tr.mean(key)) for _, tr in workloads.values()] for key, label in FIELDS]
    rows.append(["time per call"] + per_run(lambda r: f"{r.seconds * 1e3:,.3f} ms"))
    rows.append(["TFLOP/s"] + per_run(lambda r: cell(r.tflops, "{:,.3f}")))
    rows.append(["MFU, datasheet peak (%)"] + per_run(lambda r: cell(r.mfu and 100 * r.mfu, "{:.3f}")))
    rows.append(["% of measured peak"] + per_run(
        lambda r: cell(r.mfu_measured_peak and 100 * r.mfu_measured_peak, "{:.3f}")))
    head = "".join(f"<th>{w}</th>" for w in workloads)
    body = "".join("<tr>" + "".join(f"<td style='text-align:{'left' if i == 0 else 'right'}'>{v}</td>"
                                     for i, v in enumerate(r)) + "</tr>" for r in rows)
    return f"<table><tr><th>field</th>{head}</tr>{body}</table>"


def missing_note(trace: Any, gpu: bool) -> str:
    """What this machine cannot read, and (on a GPU) the memory torch holds: level 1 in every column."""
    lines = []
    missing = trace.missing()
    if missing:
        lines.append("not available here: " + "; ".join(f"{m}: {why}" for m, why in missing.items()))
    if gpu:
        import torch
        lines.append(f"torch holds {torch.cuda.memory_allocated() / 1e9:.2f} GB allocated, "
                     f"{torch.cuda.memory_reserved() / 1e9:.2f} GB reserved: level 1 is 'in use' in every column")
    return "\n".join(lines)


LEVELS = [("NVML busy", lambda r: r.metric("nvml_util")), ("SM active (GPM)", lambda r: r.metric("gpm_sm_active")),
          ("tensor active (GPM)", lambda r: r.metric("gpm_tensor_active")),
          ("MFU (datasheet)", lambda r: None if r.mfu is None else 100 * r.mfu),
          ("% of measured peak", lambda r: None if r.mfu_measured_peak is None else 100 * r.mfu_measured_peak)]


def levels_figure(runs: Sequence[tuple[str, Any]], title: str = "three levels of utilization, same FLOPs per call"):
    """Grouped bars: NVML busy, GPM SM and tensor activity and MFU for each (label, RunResult), all in %."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 3.6))
    w = 0.8 / len(LEVELS)
    for j, (lname, get) in enumerate(LEVELS):
        vals = [get(r) for _, r in runs]
        xs = [i + (j - (len(LEVELS) - 1) / 2) * w for i in range(len(runs))]
        bars = ax.bar(xs, [v or 0 for v in vals], w, label=lname)
        for b, v in zip(bars, vals):
            ax.annotate("n/a" if v is None else f"{v:.1f}" if v >= 0.1 else f"{v:.3f}",
                        (b.get_x() + b.get_width() / 2, b.get_height()), ha="center", va="bottom", fontsize=7)
    ax.set_xticks(range(len(runs)), [n for n, _ in runs])
    ax.set(ylabel="%", ylim=(0, 110), title=title)
    ax.legend(fontsize=8, ncol=len(LEVELS), loc="upper left")
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    return fig


def trap_summary(cmp_launch: Any, cmp_busy: Any, n_tiny: int, big_n: int, gpu: bool) -> str:
    """What the four workloads showed, in a paragraph built from this run's numbers."""
    run_py, run_graph, run_big = cmp_launch.before, cmp_launch.after, cmp_busy.after
    if not gpu:
        return (f"**On this CPU** the tiny matmuls took {run_py.seconds * 1e3:,.3f} ms per call and one {big_n}³ "
                f"matmul {run_big.seconds * 1e3:,.3f} ms for the same FLOPs. There is no NVML, GPM or CUDA graph "
                "here, and CPU timings at smoke sizes are noisy: the reference GPU's run shows the trap itself.")
    return (f"**What this run shows.** Launched from Python, the {n_tiny:,} tiny matmuls took "
            f"{run_py.seconds * 1e3:,.1f} ms per call and NVML read {pct(run_py.metric('nvml_util'))} busy. Replayed "
            f"from a CUDA graph, the same kernels took {run_graph.seconds * 1e3:,.1f} ms "
            f"({cmp_launch.speedup:.1f}x faster: that time was launch gaps) and NVML read "
            f"{pct(run_graph.metric('nvml_util'))} busy, at an MFU of {pct(run_graph.mfu, 100, 3)}. "
            f"The one {big_n}³ matmul did the same FLOPs in {run_big.seconds * 1e3:,.3f} ms "
            f"({cmp_busy.speedup:,.0f}x faster than the graph) at an MFU of {pct(run_big.mfu, 100)}, "
            f"with NVML reading {pct(run_big.metric('nvml_util'))}. "
            f"NVML cannot tell the graph of tiny kernels from the big matmul; MFU (and GPM's tensor activity: "
            f"{pct(run_graph.metric('gpm_tensor_active'))} vs {pct(run_big.metric('gpm_tensor_active'))}) can.")


def reference_timeline(lesson: Any, launch_name: str, busy_name: str) -> str | None:
    """Draw the reference run's timeline of the same workloads; a sentence instead when there is none to draw."""
    from ..display import plots
    from ..results import comparisons

    ref = lesson.reference
    if ref is None:
        return "No reference run is committed for this notebook yet."
    if ref["device"].get("slug") == lesson.device.slug and not lesson.small:
        return "This is the reference GPU: its timeline is the one above."
    rc = {c.name: c for c in comparisons(ref)}
    launch, busy = rc.get(launch_name), rc.get(busy_name)
    if launch and busy:
        plots.timeline((launch.before.label, launch.before.trace), (launch.after.label, launch.after.trace),
                       (busy.after.label, busy.after.trace), title=f"reference GPU: {ref['device']['name']}")
        _show()
    return None


# ---------------------------------------------------------------- what NVML cannot see


def bursts_figure(bursts: Sequence[Any]):
    """NVML's reading against the true busy share, one pair of bars per burst pattern."""
    from ..display import plots
    return plots.bars([f"{b.burst_ms:g} ms every {b.burst_ms + b.gap_ms:g} ms" for b in bursts],
                      [b.nvml_pct for b in bursts], ref=[b.true_busy_pct for b in bursts],
                      ref_label="GPU busy (CUDA events)", ylabel="% of the time",
                      title="NVML utilization.gpu (left) vs the true busy share (right)")


def blind_spots_summary(captured: Estimate | None, bursts: Sequence[Any], watch_fp32: Any, watch_big: Any,
                        dtype: str) -> str:
    """What the burst test and the FP32-vs-tensor-core pair showed."""
    if captured is None:
        return "*No burst test on this machine: it needs NVML's utilization samples from a CUDA GPU.*"
    n_periods, n_missed = sum(len(b.periods) for b in bursts), sum(b.missed_periods for b in bursts)
    verdict = ("well under the true busy time: short bursts go unseen" if captured.hi < 0.5 else
               "well over the true busy time: a period with any burst in it reads as busier than it was"
               if captured.lo > 1.5 else "close to the true busy time: the bursts are counted, not missed, and X% "
               "busy means about X% of the time had a kernel running, whatever the kernels did")
    return (f"Over {n_periods} sample periods that held bursts, NVML reported **{captured.value:.2f}x** the GPU's "
            f"busy time (per-period quartiles {captured.lo:.2f}–{captured.hi:.2f}x), and read 0% in {n_missed} of "
            f"them: {verdict}. For the other blind spot, compare the FP32 and {dtype.upper()} matmuls above: NVML "
            f"{pct(watch_fp32.mean('nvml_util'))} vs {pct(watch_big.mean('nvml_util'))}, GPM tensor active "
            f"{pct(watch_fp32.mean('gpm_tensor_active'))} vs {pct(watch_big.mean('gpm_tensor_active'))}.")


# ---------------------------------------------------------------- section 3: the timing pitfall


def host_clock(fn: Callable[[], Any], sync_after: bool, reps: int = 20) -> Any:
    """Time `fn` with the host clock `reps` times; with `sync_after`, wait for the GPU before reading the clock."""
    import torch

    from ..timing import Measurement
    gpu = torch.cuda.is_available()
    times = []
    for _ in range(reps):
        if gpu:
            torch.cuda.synchronize()          # start with an empty queue
        t0 = time.perf_counter()
        fn()
        if sync_after and gpu:
            torch.cuda.synchronize()          # wait for the work itself
        times.append(time.perf_counter() - t0)
    return Measurement("host clock", times)


def timing_report(result: Any, n: int, dtype: str, m_nosync: Any, m_sync: Any, m_events: Any, gpu: bool) -> str:
    """Record the three timings, draw them (log scale on a GPU) and say what the ratio means."""
    from ..display import plots

    timing = {"host clock,\nno sync": m_nosync.median, "host clock\n+ synchronize": m_sync.median,
              m_events.label.replace(" (", "\n("): m_events.median}
    result.record("timing_pitfall", {"n": n, "dtype": dtype, **{k.replace("\n", " "): v * 1e3 for k, v in timing.items()},
                                     "unit": "ms", "timer": m_events.timer})
    fig = plots.bars(list(timing), [v * 1e3 for v in timing.values()], ylabel="ms per matmul",
                     title=f"one {n}³ {dtype} matmul, timed three ways", fmt="{:.3f}")
    if gpu:
        fig.axes[0].set_yscale("log")  # the two sides differ by orders of magnitude on a GPU
    _show()
    return (f"Without a sync the host clock read {m_nosync.median * 1e6:,.1f} µs; {m_events.label} read "
            f"{m_events.median * 1e6:,.1f} µs: a ratio of {m_events.median / m_nosync.median:,.1f}x. "
            + ("On a GPU that ratio is the size of the mistake: the no-sync number is the launch alone." if gpu else
               "On a CPU each op has finished when it returns: there is no queue to hide the work, so both host "
               "clocks already time the work and any difference here is CPU noise. The pitfall needs a GPU."))


# ---------------------------------------------------------------- section 4: MFU of a training step


def flop_counts(cfg: Any, batch: int, n_params: int, forward_only: Callable[[], Any],
                forward_backward: Callable[[], Any]) -> dict[str, tuple[float, float]]:
    """One GPT step's FLOPs counted three ways: {count: (forward, training step)}."""
    from .. import flops as F

    L, T, d, H = cfg.n_layer, cfg.block_size, cfg.n_embd, cfg.n_head
    guide = F.guide_transformer_flops(batch, T, d, L, cfg.vocab_size)  # a forward pass, as the guide writes it
    tokens = batch * T
    return {
        "guide §1.2 formula": (guide, 3 * guide),
        "6N + 12·L·H·Q·T": (tokens * F.transformer_flops_per_token(n_params, L, H, d // H, T, training=False),
                            tokens * F.transformer_flops_per_token(n_params, L, H, d // H, T)),
        "FlopCounterMode": (F.count_flops(forward_only).total, F.count_flops(forward_backward).total),
    }


def step_peak(device: Any, peaks: Any, dtype: str) -> tuple[float | None, str]:
    """The peak a step's MFU is against: the datasheet's for `dtype`, or (on a CPU) the one measured here."""
    ds = device.datasheet_tflops(dtype)
    if ds:
        return ds, f"datasheet {dtype.upper()}"
    return peaks.tflops.get(dtype), f"measured {dtype.upper()} peak"


def gpt_step_report(result: Any, run: Any, flops: dict[str, tuple[float, float]], cfg: Any, batch: int,
                    n_params: int, peak: float | None, peak_name: str, dtype: str) -> None:
    """The step's MFU under each FLOP count: a table, notes on where the counts differ, a plot; recorded."""
    from IPython.display import HTML, Markdown, display

    from .. import flops as F
    from ..display import plots

    def mfu(t):
        return None if not peak else 100 * t / run.seconds / 1e12 / peak

    L, T, d = cfg.n_layer, cfg.block_size, cfg.n_embd
    rows = "".join(f"<tr><td style='text-align:left'>{k}</td><td>{f / 1e9:,.2f}</td><td>{t / 1e9:,.2f}</td>"
                   f"<td>{t / run.seconds / 1e12:,.2f}</td><td>{pct(mfu(t))}</td></tr>" for k, (f, t) in flops.items())
    display(HTML(f"<b>GPT {L} layers × {d} wide, {n_params / 1e6:,.1f}M weights in matmuls, batch {batch} × {T} "
                 f"tokens, {dtype}; one training step took {run.seconds * 1e3:,.2f} ms ({run.throughput:,.0f} "
                 f"tokens/s)</b><table><tr><th>FLOP count</th><th>forward GFLOP</th><th>training step GFLOP</th>"
                 f"<th>TFLOP/s</th><th>MFU ({peak_name})</th></tr>{rows}</table>"))
    (fc_f, fc_t), (fm_f, _), (g_f, _) = flops["FlopCounterMode"], flops["6N + 12·L·H·Q·T"], flops["guide §1.2 formula"]
    attn_fwd = F.attention_flops(batch, T, d, L)
    notes = [f"FlopCounterMode counted {fc_t / fc_f:.2f}x its forward count for forward + backward "
             "(the rule of thumb is 3x)."]
    gap = fm_f - fc_f
    if abs(gap) <= 0.01 * fm_f:
        notes.append("FlopCounterMode and 6N + 12·L·H·Q·T agree within 1% on the forward pass.")
    elif abs(gap - attn_fwd) <= 0.02 * fm_f:
        notes.append(f"FlopCounterMode's forward count is {gap / 1e9:,.2f} GFLOP below the formula: that is the "
                     f"attention score/value work ({attn_fwd / 1e9:,.2f} GFLOP), which this device's SDPA kernel does "
                     "not report to FlopCounterMode. Check counts against a formula.")
    else:
        notes.append(f"FlopCounterMode's forward count differs from the formula by {gap / fm_f:+.1%}.")
    missing_proj = 8 * batch * T * d ** 2 * L  # Q, K, V and output projections, forward
    notes.append(f"The guide's formula gives {g_f / fm_f:.0%} of the 6N + attention forward count here; it leaves out "
                 f"the Q/K/V/output projections ({missing_proj / 1e9:,.2f} GFLOP forward).")
    display(Markdown("\n".join(f"- {n}" for n in notes)))
    plots.bars(list(flops), [mfu(t) for _, t in flops.values()], ylabel=f"MFU (% of {peak_name})",
               title="the same measured step, three FLOP counts", fmt="{:.1f}%")
    _show()
    result.record("gpt_step", {"config": cfg.__dict__, "tokens": batch * T, "n_params": n_params,
                               "seconds": run.seconds, "flops": {k: {"forward": f, "train_step": t}
                                                                 for k, (f, t) in flops.items()},
                               "mfu": run.mfu, "nvml_util": run.metric("nvml_util"),
                               "gpm_tensor_active": run.metric("gpm_tensor_active")})


def measure_optimised(config: Any, tokens: Any, *, device: Any, min_time_s: float, peaks: Any) -> tuple[Any, str]:
    """Time the optimised loop; if torch.compile fails here, the same loop uncompiled (and a note saying so)."""
    from .. import training as T

    try:
        return T.measure_config("optimised loop", config, tokens, device=device, min_time_s=min_time_s,
                                peaks=peaks)[0], ""
    except Exception as e:  # a missing compiler or Triton must not stop the notebook
        if not config.compile:
            raise
        note = f"torch.compile failed here ({type(e).__name__}), so the loop runs uncompiled; "
        return T.measure_config("optimised loop", config.replace(compile=False), tokens, device=device,
                                min_time_s=min_time_s, peaks=peaks)[0], note


def optimised_summary(result: Any, step: Any, eager: Any, opt_mfu: Estimate | None, peaks: Any, opt_nvml: Any,
                      note: str) -> str:
    """Record the optimised loop's row and describe it beside the eager step and the BF16 peak measured here."""
    from .. import training as T
    from .measuring_lab import mfu_estimate

    opt_mfu_measured = mfu_estimate(step.run, peaks.tflops.get("bf16"))

    result.record("optimised_step", step.row() | {"mfu_bf16_interval": None if opt_mfu is None else
                                                  [opt_mfu.lo, opt_mfu.hi], "compile_note": note})
    head = (f"**{T.describe(step.config)}**: {step.step_s * 1e3:,.1f} ms per step of {step.config.tokens_per_step:,} "
            f"tokens ({step.tokens_per_s:,.0f} tokens/s); first step"
            f"{' (compile included)' if step.config.compile else ''} {step.first_step_s:,.1f} s. ")
    if opt_mfu is None:
        body = "No datasheet peak on a CPU: the MFU claim below is not tested here."
    else:
        body = (f"MFU **{opt_mfu.value:.1f}%** of the datasheet BF16 peak (quartiles of the step time: "
                f"{opt_mfu.lo:.1f}–{opt_mfu.hi:.1f}%), against the eager step's {pct(eager.mfu, 100)}; "
                + (f"{opt_mfu_measured.value:.1f}% of the BF16 peak measured here; " if opt_mfu_measured else "")
                + f"NVML busy {pct(opt_nvml and opt_nvml.value)}.")
    return head + body + (f" *{note}*" if note else "")


GPT2_SMALL = dict(batch_size=32, seq_len=1024, hidden_size=768, num_layers=12, vocab_size=50257)


def gpt2_small_example(result: Any) -> dict[str, tuple[float, float]]:
    """The guide's GPT-2 small example (batch 32 × 1024) counted three ways, on the meta device; recorded."""
    import torch
    from IPython.display import HTML, display

    from .. import flops as F
    from ..workloads import GPT, GPTConfig

    guide_fwd = F.guide_transformer_flops(**GPT2_SMALL)
    with torch.device("meta"):  # shapes without data: a full-size count in about a second, on any machine
        model = GPT(GPTConfig(vocab_size=50257, n_layer=12, n_head=12, n_embd=768, block_size=1024))
        idx = torch.randint(0, 50257, (32, 1024))
    n, tok = model.num_params(), 32 * 1024
    ex = {"guide §1.2 formula": (guide_fwd, 3 * guide_fwd),
          "6N + 12·L·H·Q·T": (tok * F.transformer_flops_per_token(n, 12, 12, 64, 1024, training=False),
                              tok * F.transformer_flops_per_token(n, 12, 12, 64, 1024)),
          "FlopCounterMode (meta device)": (F.count_flops(lambda: model(idx)).total,
                                            F.count_flops(lambda: model(idx, idx)[1].backward()).total)}
    rows = "".join(f"<tr><td style='text-align:left'>{k}</td><td>{f / 1e12:,.2f}</td><td>{t / 1e12:,.2f}</td></tr>"
                   for k, (f, t) in ex.items())
    display(HTML(f"<b>GPT-2 small ({n / 1e6:,.1f}M weights in matmuls), batch 32 × 1024</b><table><tr><th>count"
                 f"</th><th>forward TFLOP</th><th>training step TFLOP</th></tr>{rows}<tr><td style='text-align:left'>"
                 "the guide's stated result</td><td colspan=2>1.7</td></tr></table>"))
    result.record("gpt2_small_example", {k: {"forward": f, "train_step": t} for k, (f, t) in ex.items()})
    return ex


# ---------------------------------------------------------------- small pieces of the notebook's cells


def workloads_timeline(workloads: dict[str, tuple[Any, Any]], gpu: bool):
    """One monitor's timeline of every workload: NVML, GPM and power on a GPU; NVML and the CPU on a CPU."""
    from ..display import plots
    return plots.timeline(*[(name, tr) for name, (_, tr) in workloads.items()],
                          metrics=("nvml_util", "gpm_sm_active", "gpm_tensor_active", "power_w") if gpu else
                          ("nvml_util", "cpu_percent"),
                          title="one monitor, four workloads (the three non-idle ones do equal FLOPs)")


def period_note(period: Estimate, bursts: Sequence[tuple[float, float]]) -> str:
    """NVML's sample period against the longest idle gap of the burst patterns."""
    return (f"NVML's sample period here: {period.value * 1e3:.0f} ms (quartiles {period.lo * 1e3:.0f}-"
            f"{period.hi * 1e3:.0f} ms); the longest idle gap below: {max(g for _, g in bursts)} ms")


def try_tiny_panel(lesson: Any, peaks: Any, dtype: str, min_time_s: float) -> Any:
    """A widget: pick a tiny-matmul size and how it is launched; Run measures NVML busy against MFU."""
    from IPython.display import Markdown

    from ..experiment import measure
    from .matmul_lab import TinyMatmuls
    from ..display.widgets import control_panel

    dev = lesson.device

    def try_tiny(size, launch):
        if launch == "CUDA graph" and not lesson.gpu:
            return Markdown("CUDA graphs need a CUDA GPU: pick the Python loop on this machine.")
        k = 64 if lesson.small else 4096
        work = TinyMatmuls(k, int(size), dtype, dev.torch_device, graph=launch == "CUDA graph")
        r = measure(work, label=f"{k} × {size}³, {launch}", flops=work.flops, dtype=dtype,
                    min_time_s=min(min_time_s, 0.5), device=dev, peaks=peaks)
        return Markdown(f"**{r.label}**: {r.seconds * 1e3:,.2f} ms per call, {r.tflops:,.2f} TFLOP/s; NVML busy "
                        f"{pct(r.metric('nvml_util'))}, tensor active {pct(r.metric('gpm_tensor_active'))}, "
                        f"MFU {pct(r.mfu, 100, 3)}")

    return control_panel(try_tiny, size=[8, 16, 32] if lesson.small else [64, 128, 256, 512, 1024],
                         launch=["Python loop", "CUDA graph"])
