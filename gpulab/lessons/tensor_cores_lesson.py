"""Notebook 02's scaffolding: its sizes and claims as data, and the tables, figures and sentences that report what
it measured (formats, the sweep, the roofline, dtype speedups, tensor activity, alignment).

The measuring stays in the notebook and in `gpulab.lessons.matmul_lab`; nothing here times anything except the widget.
"""
from __future__ import annotations

import math
from typing import Any, Sequence

from ..claims import Estimate
from ..lesson import ClaimSpec
from .matmul_lab import fmt_tflops, format_mismatches

# Sizes: full on a CUDA GPU, smoke with SMOKE=True or without a GPU (gl.lesson picks and records which).
FULL = dict(SIZES=[256, 512, 1024, 2048, 4096, 8192], DTYPES=["fp32", "tf32", "bf16", "fp16", "fp8"],
            SWEEP_MIN_TIME_S=0.25, MIN_TIME_S=1.0, BIG_N=8192, SIZE_BIG=4096, SIZE_SMALL=512, ALIGN_N=4096,
            ALIGN_BATCH=32, ALIGN_SEQ=1024, ALIGN_HIDDEN=768, ALIGN_HEADS=12, ROUNDS=12)
SMOKE = dict(SIZES=[32, 64, 128], SWEEP_MIN_TIME_S=0.03, MIN_TIME_S=0.05, BIG_N=128, SIZE_BIG=128, SIZE_SMALL=32,
             ALIGN_N=128, ALIGN_BATCH=4, ALIGN_SEQ=64, ALIGN_HIDDEN=64, ALIGN_HEADS=4, ROUNDS=2)

# The guide's §7.3 table, as printed: the claims being checked.
GUIDE_7_3 = {"FP32": dict(exponent_bits=8, mantissa_bits=23, max_abs=3.4e38, digits=7),
             "TF32": dict(exponent_bits=8, mantissa_bits=10, max_abs=3.4e38, digits=3),
             "BF16": dict(exponent_bits=8, mantissa_bits=7, max_abs=3.4e38, digits=2),
             "FP16": dict(exponent_bits=5, mantissa_bits=10, max_abs=65504, digits=3)}
_ALIGN = "(aligned ÷ misaligned TFLOP/s)"
CLAIMS = [
    *[dict(key=f"format_{name}", text=f"{name}: {row['exponent_bits']} exponent bits, {row['mantissa_bits']} mantissa "
           f"bits, ±{row['max_abs']:g}, {row['digits']} digits", low=0, high=0, unit="fields wrong",
           source="guide §7.3", evidence="definition") for name, row in GUIDE_7_3.items()],
    dict(key="tf32_8x", text="TF32: ~8x faster than FP32", low=7, high=9, unit="x", source="guide §2.1, §7.3",
         needs=("cuda",)),
    dict(key="tf32_auto", text="TF32: automatic for FP32 matmuls, no code change (default FP32 time / TF32 time)",
         low=0.9, high=1.1, unit="x", source="guide §2.1, §7.3", needs=("cuda",)),
    dict(key="fp8_4x", text="FP8: 4x faster than FP16", low=3.5, high=4.5, unit="x", source="guide §2.1",
         needs=("fp8",)),
    dict(key="fp8_h100", text="FP8: H100 only (other GPU models with FP8 tensor cores)", low=0, high=0,
         unit="models", source="guide §2.1", evidence="datasheet"),
    dict(key="tensor_80", text="Tensor Core active: target 80%+ of peak sustained (a big matmul)", low=80, unit="%",
         source="guide §2.3", needs=("cuda",)),
    dict(key="tensor_50", text="Tensor Core active below 50% indicates underutilization (small matrices)", low=0,
         high=50, unit="%", source="guide §2.3", needs=("cuda",)),
    *[dict(key=f"align_{what}", text=f"{text} {_ALIGN}", low=1.05, unit="x", source="guide §2.2",
           needs=("cuda", "full")) for what, text in (
        ("hidden size", "hidden_size = 770 is bad (padding overhead) next to 768"),
        ("batch size", "batch_size = 33 is bad (wastes compute) next to 32"),
        ("sequence length", "seq_len = 1000 is bad (padding waste) next to 1024"))],
    dict(key="tiles", text="Tensor-core tile shapes: 16×16×16 (Volta/Turing), 16×8×16 (Ampere), 64×64×16 (Hopper)",
         low=16, unit="elements", source="guide §2.2, §2.3"),
    dict(key="kernel_names", text="Tensor-core kernels are named like volta_fp16_s884gemm", low=1, unit="kernels",
         source="guide §2.2, §2.3"),
    dict(key="ncu", text="ncu sm__pipe_tensor_op_hmma_cycles_active: 80%+ of peak sustained", low=80, unit="%",
         source="guide §2.2, §2.3"),
    *[dict(key=f"mfu_{i}", text=text, low=low, high=high, unit="%", source="guide §2.3") for i, (text, low, high) in
      enumerate([("CNN (ResNet-50 on A100 FP16): expected MFU 60-75%", 60, 75),
                 ("Transformer (GPT-3 175B on 8×A100): expected MFU 45-55%", 45, 55),
                 ("ViT on a single A100: expected MFU 55-65%", 55, 65),
                 ("BERT-Large on A100: expected MFU 50-60%", 50, 60)])],
]
UNTESTABLE = {
    "tiles": "instruction shapes, not throughput: one GPU shows only its own, and only through sizes' effect",
    "kernel_names": "kernel names change with every cuBLAS release; GPM tensor activity above answers the question "
                    "directly",
    "ncu": "needs Nsight Compute; the equivalent GPM counter is read above through NVML (section 5)"}
OTHER_SYSTEMS = ["ResNet-50 on an A100", "GPT-3 175B on eight A100s", "a ViT on an A100", "BERT-Large on an A100"]


def _show() -> None:
    import matplotlib.pyplot as plt
    plt.show()


def bad_neighbours(align_n: int, batch: int, seq: int, hidden: int) -> dict[str, int]:
    """The guide's "bad" neighbours (§2.2) of the aligned sizes: batch 33 for 32, hidden 770 for 768, sequence
    1000 for 1024, and an odd square size."""
    return dict(n=align_n - 1, batch=batch + 1, hidden=hidden + 2, seq=round(seq * 1000 / 1024))


def declare_square_claim(lesson: Any, align_n: int, bad_n: int) -> None:
    """The square-matmul alignment claim names this run's sizes, so it is declared once they are known."""
    lesson.claims["align_square matmul"] = ClaimSpec(
        key="align_square matmul", text=f"Matmul dimensions should be multiples of 8 for tensor cores ({align_n} vs "
        f"{bad_n}) {_ALIGN}", low=1.05, unit="x", source="guide §2.2", needs=("cuda", "full"))


def unavailable_note(supported: dict[str, str | None], gpu: bool) -> str:
    """What this device cannot run, and what a CPU run means."""
    skipped = {d: why for d, why in supported.items() if why}
    out = ("**Not available on this device:** " + "; ".join(f"{d.upper()}: {why}" for d, why in skipped.items())
           + ". Those measurements are skipped and their claims marked *not tested*.") if skipped else ""
    if not gpu:
        out += ("\n\n**No CUDA GPU here.** There are no tensor cores on a CPU, so the speedups below say nothing about "
                "a GPU: the reference GPU's numbers are shown beside ours where they exist.")
    return out


# ---------------------------------------------------------------- section 1: formats


def check_formats(lesson: Any, formats: Sequence[Any]) -> list[Any]:
    """Judge the §7.3 table row by row: how many of its fields differ from what torch.finfo says."""
    by_name = {f.name: f for f in formats}
    out = []
    for name, row in GUIDE_7_3.items():
        f = by_name[name]
        bad = format_mismatches(f, **row)
        out.append(lesson.check(f"format_{name}", len(bad), "; ".join(bad) if bad else
                                f"finfo: {f.exponent_bits} + {f.mantissa_bits} bits, max {f.max:.4g}, {f.digits:.2f} "
                                "digits" + (" (TF32 derived: not a torch dtype)" if f.torch_dtype is None else "")))
    return out


def digits_note(formats: Sequence[Any]) -> str:
    """Why FP32 is "7 digits" by one count and "6" by PyTorch's."""
    import torch

    by_name = {f.name: f for f in formats}
    f32, res = by_name["FP32"], torch.finfo(torch.float32).resolution
    return (f"`torch.finfo(torch.float32).resolution` is {res:g}: PyTorch (like NumPy) calls FP32 a "
            f"{round(-math.log10(res))}-digit format, counting whole digits guaranteed by eps ({f32.eps:.3g}); the "
            f"(mantissa + 1)·log10 2 count gives {f32.digits:.2f}. Both are fair; the table's integer is the second "
            f"one rounded down. BF16 keeps FP32's range with {by_name['BF16'].mantissa_bits} mantissa bits; FP16 keeps "
            f"{by_name['FP16'].mantissa_bits} mantissa bits but overflows past {by_name['FP16'].max:g}.")


# ---------------------------------------------------------------- sections 2 and 3: sweep and roofline


def reference_sweep(ref: dict | None) -> Any:
    """The reference run's sweep, or None."""
    from .matmul_lab import MatmulSweep
    return MatmulSweep.from_dict(ref["extra"]["sweep"]) if ref and "sweep" in ref.get("extra", {}) else None


def sweep_figures(sweep: Any, sizes: Sequence[int], device: Any, peaks: Any, low: str, ref_sweep: Any) -> str:
    """Throughput and share of peak by size and dtype (the reference's BF16 and FP32 beside); the best points."""
    from ..display import plots

    hl = {}
    if device.datasheet_tflops(low):
        hl[f"datasheet {low.upper()} {device.datasheet_tflops(low):g}"] = device.datasheet_tflops(low)
    if low in peaks.tflops:
        hl[f"measured {low.upper()} peak {peaks.tflops[low]:,.1f}"] = peaks.tflops[low]
    dtypes = sweep.measured_dtypes()
    plots.sweep(sizes, {d.upper(): sweep.series(d) for d in dtypes}, xlabel="n (n×n×n matmul)",
                ylabel="achieved TFLOP/s", title=f"matmul throughput on {device.name}", logx=True, logy=True,
                hlines=hl, ref={d.upper(): (ref_sweep.sizes, ref_sweep.series(d)) for d in ("bf16", "fp32")}
                if ref_sweep else None)
    _show()
    use_ds = any(p.frac_datasheet is not None for p in sweep.points)
    attr, what = ("frac_datasheet", "datasheet") if use_ds else ("frac_measured", "measured")

    def pcts(s, d, a):
        return [None if v is None else 100 * v for v in s.series(d, a)]

    fig = plots.sweep(sizes, {d.upper(): pcts(sweep, d, attr) for d in dtypes}, xlabel="n (n×n×n matmul)",
                      ylabel=f"% of the {what} peak for the dtype", title="share of peak by size (a bare matmul's MFU)",
                      logx=True, ref={"BF16": (ref_sweep.sizes, pcts(ref_sweep, "bf16", "frac_datasheet"))}
                      if ref_sweep else None)
    fig.axes[0].set_ylim(0, 110)
    _show()
    return "Best point per dtype in this run: " + "; ".join(
        f"**{d.upper()}** {fmt_tflops(p.tflops)} TFLOP/s at n={p.n}"
        + ("" if p.frac_datasheet is None else f" ({p.frac_datasheet:.0%} of the datasheet {p.datasheet_tflops:g})")
        for d, p in ((d, sweep.best(d)) for d in dtypes)) + "."


def roofline_report(sweep: Any, peaks: Any, device: Any, low: str, ref: dict | None, ref_sweep: Any) -> str:
    """Draw the roofline of the tensor-core dtype's sweep (and, on a CPU, the reference GPU's); a table of bounds."""
    from ..display import plots
    from ..device import MeasuredPeaks

    roof_dtype = low if low in peaks.tflops else "fp32"
    pts = [p for p in sweep.points if p.dtype == roof_dtype]
    text = ""
    if pts and peaks.copy_gbs:
        peak = peaks.tflops[roof_dtype]
        plots.roofline([(str(p.n), p.intensity, p.tflops) for p in pts], peak_tflops=peak,
                       bandwidth_gbs=peaks.copy_gbs, title=f"{roof_dtype.upper()} matmuls on {device.name}")
        _show()
        ridge = peak * 1e12 / (peaks.copy_gbs * 1e9)
        rows = []
        for p in pts:
            roof = min(peak, p.intensity * peaks.copy_gbs / 1e3)
            rows.append(f"| {p.n} | {p.intensity:,.0f} | {'memory' if p.intensity < ridge else 'compute'}-bound | "
                        f"{fmt_tflops(roof)} | {fmt_tflops(p.tflops)} | {p.tflops / roof:.0%} |")
        text = (f"Ridge point: {ridge:,.0f} FLOPs/byte ({fmt_tflops(peak)} TFLOP/s ÷ {peaks.copy_gbs:,.0f} GB/s, both "
                "measured).\n\n| n | FLOPs/byte | by the roofline | roof (TFLOP/s) | achieved | share of roof |\n"
                "| --- | --- | --- | --- | --- | --- |\n" + "\n".join(rows) + "\n\n"
                + ("A point far below its roof is limited by neither ceiling: at small sizes one kernel is too short to "
                   "fill the GPU, and fixed costs (launch, tile set-up, too few tiles for the SMs) dominate."
                   if device.is_cuda else "On a CPU at smoke sizes these timings are noisy and say little about a "
                   "GPU: the reference GPU's roofline follows when a reference run is committed."))
    if not device.is_cuda and ref_sweep is not None and "peaks" in ref.get("extra", {}):
        rp = MeasuredPeaks.from_dict(ref["extra"]["peaks"])
        rpts = [p for p in ref_sweep.points if p.dtype == "bf16"]
        if rpts and "bf16" in rp.tflops and rp.copy_gbs:
            plots.roofline([(str(p.n), p.intensity, p.tflops) for p in rpts], peak_tflops=rp.tflops["bf16"],
                           bandwidth_gbs=rp.copy_gbs, title=f"reference GPU: BF16 matmuls on {rp.device}")
            _show()
    return text


# ---------------------------------------------------------------- section 4: dtype speedups


def tf32_default_note(m_default: Any, tf32_seconds: float, precision: str) -> str:
    """What PyTorch's defaults do with an FP32 matmul, against the TF32 time."""
    import torch
    return (f"With PyTorch's defaults (`torch.get_float32_matmul_precision()` = `'{precision}'`) the FP32 matmul took "
            f"{m_default.median * 1e3:,.2f} ms: {m_default.median / tf32_seconds:.2f}x the TF32 time. For convolutions "
            f"cuDNN's switch `torch.backends.cudnn.allow_tf32` is `{torch.backends.cudnn.allow_tf32}` by default; for "
            "matmuls TF32 is opt-in (`torch.set_float32_matmul_precision('high')`, or "
            "`torch.backends.cuda.matmul.allow_tf32 = True`).")


def fp8_models() -> tuple[list[str], list[str]]:
    """GPUs in the datasheet table with an FP8 peak, and those of them other than the H100 (and the H200, the
    same Hopper chip)."""
    from .matmul_lab import fp8_datasheet_models
    models = fp8_datasheet_models()
    return models, [m for m in models if not any(h in m for h in ("H100", "H200"))]


def fp8_datasheet_note(device: Any) -> str:
    """The datasheet's FP8 GPUs and this GPU's FP8 : FP16 ratio (not measured)."""
    ds8, ds16 = device.datasheet_tflops("fp8"), device.datasheet_tflops("fp16")
    return ("**From the datasheet table, not measured:** GPUs listed with an FP8 tensor-core peak: "
            + ", ".join(fp8_models()[0]) + "."
            + (f" This GPU's datasheet FP8 : FP16 ratio is {ds8 / ds16:.1f}x (dense)." if ds8 and ds16 else ""))


def datasheet_ratio(device: Any, a: str, b: str) -> str:
    """"; this GPU's datasheet ratio (dense): Nx" for dtypes a over b, or "" without both peaks."""
    pa, pb = device.datasheet_tflops(a), device.datasheet_tflops(b)
    return f"; this GPU's datasheet ratio (dense): {pa / pb:.1f}x" if pa and pb else ""


def check_dtype_claims(lesson: Any, cmp_tf32: Any, m_default: Any, precision: str, cmp_fp8: Any,
                       supported: dict[str, str | None], big_n: int) -> list[Any]:
    """TF32's 8x and "no code change", FP8's 4x and "H100 only", each on its interval or with the reason not."""
    from .measuring_lab import ratio

    tf32_why = supported["tf32"]
    out = [lesson.check("tf32_8x", None if tf32_why else cmp_tf32, tf32_why or f"{big_n}³ matmul; interval: "
                        "interleaved rounds" + datasheet_ratio(lesson.device, "tf32", "fp32"))]
    default_est = None if tf32_why else ratio(m_default.estimate(), cmp_tf32.after.measurement.estimate())
    out.append(lesson.check("tf32_auto", default_est, tf32_why or f"default float32 matmul precision '{precision}' "
                            "(PyTorch's default is 'highest': TF32 off for matmuls)"))
    out.append(lesson.check("fp8_4x", cmp_fp8, f"{big_n}³ matmul, torch._scaled_mm, per-tensor scale 1; interval: "
                            "interleaved rounds" + datasheet_ratio(lesson.device, "fp8", "fp16") if cmp_fp8 else
                            supported["fp8"] or "FP8 not run"))
    non_h100 = fp8_models()[1]
    out.append(lesson.check("fp8_h100", len(non_h100), "gpulab's datasheet table, not measured (the H200, a Hopper "
                            "chip like the H100, not counted): " + ", ".join(non_h100)))
    return out


# ---------------------------------------------------------------- section 5: tensor activity


def check_tensor_activity(lesson: Any, watch_big: Any, watch_small: Any, big_n: int, k_small: int,
                          size_small: int, dtype: str) -> list[Any]:
    """GPM tensor activity of a big matmul (80%+, its steady state over a longer window) and of small ones (<50%)."""
    from .measuring_lab import gpm_estimate

    why = "needs GPM tensor activity (a Hopper or newer GPU with profiling counters readable)"
    big = gpm_estimate(watch_big, "gpm_tensor_active", steady=True)
    small = gpm_estimate(watch_small, "gpm_tensor_active")
    return [lesson.check("tensor_80", big, why if big is None else f"one {big_n}³ {dtype} matmul back to back for "
                         f"{watch_big.duration_s:.1f} s (gl.watch): the median of its 1 s GPM readings, the first and last "
                         "dropped (start-up, a partial second); interval: a 95% interval of that median"),
            lesson.check("tensor_50", small, why if small is None else f"{k_small} × {size_small}³ {dtype} matmuls "
                         f"from Python, back to back for {watch_small.duration_s:.1f} s (gl.watch)")]


# ---------------------------------------------------------------- section 6: alignment


def alignment_pairs(bad: dict[str, int], align_n: int, batch: int, seq: int, hidden: int, heads: int, dtype: str,
                    device: Any) -> dict[str, tuple]:
    """{dimension: (misaligned fn, its FLOPs, aligned fn, its FLOPs, labels)} for the four alignment pairs."""
    from .matmul_lab import Matmul, block_forward, mlp_forward

    mm_bad, mm_good = Matmul(bad["n"], dtype, device), Matmul(align_n, dtype, device)
    f_bad, fl_bad = mlp_forward(batch * seq, bad["hidden"], dtype, device)
    f_good, fl_good = mlp_forward(batch * seq, hidden, dtype, device)
    b_bad, bl_bad = block_forward(bad["batch"], seq, hidden, heads, dtype, device)
    b_good, bl_good = block_forward(batch, seq, hidden, heads, dtype, device)
    s_bad, sl_bad = block_forward(batch, bad["seq"], hidden, heads, dtype, device)
    return {"square matmul": (mm_bad, mm_bad.flops, mm_good, mm_good.flops, f"{bad['n']}³", f"{align_n}³"),
            "hidden size": (f_bad, fl_bad, f_good, fl_good, f"MLP hidden {bad['hidden']}", f"MLP hidden {hidden}"),
            "batch size": (b_bad, bl_bad, b_good, bl_good, f"block, batch {bad['batch']}", f"block, batch {batch}"),
            "sequence length": (s_bad, sl_bad, b_good, bl_good, f"block, seq {bad['seq']}", f"block, seq {seq}")}


def alignment_report(align: dict[str, Any], ratio_est: dict[str, Estimate], ref: dict | None, dtype: str) -> str:
    """A table and a bar chart of aligned ÷ misaligned TFLOP/s (the reference's beside); returns the table."""
    from ..display import plots
    from ..results import comparisons

    rows = "".join(f"<tr><td style='text-align:left'>{w}</td><td>{c.before.label}</td><td>{c.before.tflops:,.2f}</td>"
                   f"<td>{c.after.label}</td><td>{c.after.tflops:,.2f}</td><td><b>{ratio_est[w]!r}</b></td>"
                   f"<td>{'yes' if c.within_noise else 'no'}</td></tr>" for w, c in align.items())
    ref_ratio = None
    if ref:
        rc = {c.name: c for c in comparisons(ref)}
        ref_ratio = [rc[c.name].after.tflops / rc[c.name].before.tflops if c.name in rc and rc[c.name].before.tflops
                     else None for c in align.values()]
    fig = plots.bars(list(ratio_est), [e.value for e in ratio_est.values()], ylabel="aligned ÷ misaligned TFLOP/s",
                     title=f"alignment: throughput per FLOP ({dtype.upper()})", fmt="{:.3f}", ref=ref_ratio)
    fig.axes[0].axhline(1.0, color="k", lw=0.8)
    fig.axes[0].axhline(1.05, color="#b42318", lw=0.8, ls=":")
    _show()
    return (f"<b>Alignment, {dtype.upper()}</b><table><tr><th>dimension</th><th>misaligned</th><th>TFLOP/s</th>"
            "<th>aligned</th><th>TFLOP/s</th><th>aligned ÷ misaligned [interval]</th><th>times within noise</th>"
            f"</tr>{rows}</table>")


def check_alignment(lesson: Any, align: dict[str, Any], ratio_est: dict[str, Estimate]) -> list[Any]:
    """The guide's four "bad" sizes, judged on aligned ÷ misaligned TFLOP/s at the guide's sizes on a GPU."""
    out = []
    for what, cmp in align.items():
        why = lesson.missing("cuda", "full")
        out.append(lesson.check(f"align_{what}", ratio_est[what], f"{cmp.before.label}: {cmp.before.tflops:,.1f} "
                                f"TFLOP/s; {cmp.after.label}: {cmp.after.tflops:,.1f} TFLOP/s") if not why else
                   lesson.untested(f"align_{what}", "needs a CUDA GPU at the guide's sizes: a claim about tensor "
                                   "cores; see the reference run"))
    return out


def where_it_lands(bad: dict[str, int], batch: int, seq: int, hidden: int) -> str:
    """Why the same off-by-a-little costs differently depending on the dimension it lands in."""
    tok_bad, tok_seq = bad["batch"] * seq, batch * bad["seq"]

    def mult(x, m):
        return "a" if x % m == 0 else "not a"
    return (f"Where the dimension lands matters. In a transformer, batch and sequence are flattened into the token "
            f"dimension of every linear layer: batch {bad['batch']} × {seq} = {tok_bad:,} tokens ({mult(tok_bad, 64)} "
            f"multiple of 64), batch {batch} × {bad['seq']} = {tok_seq:,} ({mult(tok_seq, 64)} multiple of 64). The "
            "sequence length is also both sides of attention's T×T score matrix, where the fused attention kernel "
            f"works in tiles. The hidden size is a *K/N* dimension of every weight matrix: {bad['hidden']} is "
            f"{mult(bad['hidden'], 8)} multiple of 8.")


# ---------------------------------------------------------------- the rest


def record_the_rest(lesson: Any) -> None:
    """Claims about instructions, kernel names and tools (not tested), and other systems' MFU (not comparable)."""
    for key, why in UNTESTABLE.items():
        lesson.untested(key, why)
    for i, system in enumerate(OTHER_SYSTEMS):
        lesson.not_comparable(f"mfu_{i}", None, f"{system}: another model and GPU; notebook 01 measures a GPT "
                              "training step's MFU on this GPU")


def matmul_panel(device: Any, peaks: Any, sizes: Sequence[int], dtypes: Sequence[str], min_time_s: float) -> Any:
    """A widget: pick n and a dtype; Run times one n×n×n matmul against both peaks."""
    from IPython.display import Markdown

    from .matmul_lab import measure_matmul
    from ..display.widgets import control_panel

    def run_one(n, dtype):
        try:
            return measure_matmul(int(n), dtype, device, min_time_s=min_time_s, peaks=peaks)
        except ValueError as e:  # e.g. FP8 needs sizes that are multiples of 16
            return Markdown(f"Cannot run this one: {e}")

    return control_panel(run_one, n=sorted(set(sizes)), dtype=list(dtypes))
