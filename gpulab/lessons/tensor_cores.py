"""Notebook 02 (tensor cores): its claims as data, the alignment pairs, and its figures and tables."""
from __future__ import annotations

from typing import Any, Sequence

from ..measuring.estimates import Estimate
from ..measuring.text import pct, ratio, si
from ..verdicts.lesson import ClaimSpec

# The guide's §7.3 table, as printed (each row quoted verbatim below): the claims being checked.
GUIDE_7_3 = {"FP32": dict(exponent_bits=8, mantissa_bits=23, max_abs=3.4e38, digits=7),
             "TF32": dict(exponent_bits=8, mantissa_bits=10, max_abs=3.4e38, digits=3),
             "BF16": dict(exponent_bits=8, mantissa_bits=7, max_abs=3.4e38, digits=2),
             "FP16": dict(exponent_bits=5, mantissa_bits=10, max_abs=65504, digits=3)}
_ROWS = {"FP32": "FP32   | 8        | 23            | ±3.4e38    | 7 digits",
         "TF32": "TF32   | 8        | 10            | ±3.4e38    | 3 digits",
         "BF16": "BF16   | 8        | 7             | ±3.4e38    | 2 digits",
         "FP16": "FP16   | 5        | 10            | ±65504     | 3 digits"}
_ALIGN = "(aligned ÷ misaligned TFLOP/s)"
# §2.3's MFU table. Its GPT-3 row ("Expected MFU: 45-55%", 8 GPUs, communication overhead) is judged in notebook 10,
# beside a multi-GPU MFU; the keys keep the table's row numbers.
_MFU = {0: ("CNN (ResNet-50 on A100 FP16): expected MFU 60-75%", "Expected MFU: 60-75%", 60, 75),
        2: ("ViT on a single A100: expected MFU 55-65%", "Expected MFU: 55-65%", 55, 65),
        3: ("BERT-Large on A100: expected MFU 50-60%", "Expected MFU: 50-60%", 50, 60)}
CLAIMS = [
    *[dict(key=f"format_{name}", text=f"{name}: {row['exponent_bits']} exponent bits, {row['mantissa_bits']} mantissa "
           f"bits, ±{row['max_abs']:g}, {row['digits']} digits", quote=_ROWS[name], low=0, high=0, unit="fields wrong",
           source="guide §7.3", evidence="definition") for name, row in GUIDE_7_3.items()],
    # §7.3's "8× faster than FP32 (uses Tensor Cores)" is judged once, in notebook 07; §2.1's own sentence here.
    dict(key="tf32_speedup", text="TF32: ~8x faster than FP32 on a matmul (FP32 time / TF32 time)",
         quote="Gives ~8× speedup over FP32 with no code changes", low=7, high=9, unit="x", source="guide §2.1",
         needs=("cuda",)),
    dict(key="tf32_auto", text="TF32: automatic for FP32 matmuls, no code change (default FP32 time / TF32 time)",
         quote="TF32: Automatic for FP32 on Ampere+ (no code change)", low=0.9, high=1.1, unit="x",
         source="guide §2.1 (and §7.3)", needs=("cuda",)),
    dict(key="fp8_4x", text="FP8: 4x faster than FP16", quote="4× faster than FP16", low=3.5,
         high=4.5, unit="x", source="guide §2.1", needs=("fp8",)),
    dict(key="fp8_h100", text="FP8: H100 only (other GPU models with FP8 tensor cores)",
         quote="FP8: H100 only", low=0, high=0, unit="models", source="guide §2.1",
         evidence="datasheet"),
    dict(key="tensor_80", text="Tensor Core active: target 80%+ of peak sustained (a training step)", low=80,
         unit="%", quote="Target: 80%+ of peak sustained active", source="guide §2.3", needs=("cuda",)),
    dict(key="tensor_50", text="Tensor Core active below 50% indicates underutilization (small matrices)", low=0,
         high=50, unit="%", quote="<50% indicates underutilization (small matrices, poor batching)",
         source="guide §2.3", needs=("cuda",)),
    *[dict(key=f"align_{what}", text=f"{text} {_ALIGN}", quote=quote, low=1.05, unit="x", source="guide §2.2",
           needs=("cuda", "full")) for what, text, quote in (
        ("hidden size", "hidden_size = 770 is bad (padding overhead) next to 768",
         "hidden_size = 770  # Bad (padding overhead)"),
        ("batch size", "batch_size = 33 is bad (wastes compute) next to 32", "batch_size = 33  # Bad (wastes compute)"),
        ("sequence length", "seq_len = 1000 is bad (padding waste) next to 1024",
         "seq_len = 1000  # Bad (padding waste)"))],
    dict(key="tiles", text="Tensor-core tile shapes: 16×16×16 (Volta/Turing), 16×8×16 (Ampere), 64×64×16 (Hopper)",
         quote="Volta/Turing: 16×16×16 (FP16)", low=16, unit="elements", source="guide §2.2"),
    dict(key="kernel_names", text="Tensor-core kernels are named like volta_fp16_s884gemm", low=1, unit="kernels",
         quote='Look for kernels like: "volta_fp16_s884gemm_fp16_128x128_ldg8_f2f"', source="guide §2.2"),
    dict(key="ncu", text="ncu sm__pipe_tensor_op_hmma_cycles_active: 80%+ of peak sustained", low=80, unit="%",
         quote="ncu --metrics sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active",
         source="guide §2.3"),
    *[dict(key=f"mfu_{i}", text=text, quote=quote, low=low, high=high, unit="%", source="guide §2.3")
      for i, (text, quote, low, high) in _MFU.items()],
]
UNTESTABLE = {
    "tiles": "instruction shapes, not throughput: one GPU shows only its own, and only through sizes' effect",
    "kernel_names": "kernel names change with every cuBLAS release; GPM tensor activity above answers the question "
                    "directly",
    "ncu": "needs Nsight Compute; the equivalent GPM counter is read above through NVML (section 3)"}
OTHER_SYSTEMS = {0: "ResNet-50 on an A100", 2: "a ViT on an A100", 3: "BERT-Large on an A100"}
COLORS = {"fp32": "#7f7f7f", "tf32": "#1f77b4", "bf16": "#2ca02c", "fp16": "#ff7f0e", "fp8": "#9467bd"}


def bad_neighbours(align_n: int, batch: int, seq: int, hidden: int) -> dict[str, int]:
    """The guide's "bad" neighbours (§2.2) of the aligned sizes: batch 33 for 32, hidden 770 for 768, sequence
    1000 for 1024, and an odd square size."""
    return dict(n=align_n - 1, batch=batch + 1, hidden=hidden + 2, seq=round(seq * 1000 / 1024))


def square_claim(align_n: int, bad_n: int) -> ClaimSpec:
    """The square-matmul alignment claim, naming this run's sizes (every dimension odd: a condition of ours)."""
    return ClaimSpec(key="align_square matmul", text=f"Matmul dimensions should be multiples of 8 for tensor cores "
                     f"({align_n} vs {bad_n}) {_ALIGN}", quote="Hidden dimensions: Multiples of 8/16", low=1.05,
                     unit="x", source="guide §2.2 (a square matmul with every dimension odd is our test of it)",
                     needs=("cuda", "full"))


def fp8_models() -> tuple[list[str], list[str]]:
    """GPUs in the datasheet table with an FP8 peak, and those of them other than the H100 (and the H200, the
    same Hopper chip)."""
    from ..workloads.matmuls import fp8_datasheet_models
    models = fp8_datasheet_models()
    return models, [m for m in models if not any(h in m for h in ("H100", "H200"))]


def datasheet_ratio(device: Any, a: str, b: str) -> str:
    """"; this GPU's datasheet ratio (dense): 7.89x" for dtypes a over b, or "" without both peaks."""
    pa, pb = device.datasheet_tflops(a), device.datasheet_tflops(b)
    return f"; this GPU's datasheet ratio (dense): {ratio(pa / pb)}" if pa and pb else ""


def searched_ratio(peaks: Any, a: str, b: str) -> tuple[Estimate | None, str]:
    """dtype a's best-shape rate over b's from the shape search (`gl.measure_peaks`), each the best round of its best
    shape, the interval from their rounds' ranges; and a note naming both shapes. (None, "") without both:
    one square size can sit on an edge of a dtype's tile grid that the search steps past (7.0x at 8192³ where the
    searched shapes read 7.41x on one H200)."""
    if a not in peaks.tflops or b not in peaks.tflops:
        return None, ""
    (alo, ahi), (blo, bhi) = peaks.interval[a], peaks.interval[b]
    ta, tb = peaks.tflops[a], peaks.tflops[b]
    value = ta / tb
    shape = {d: "x".join(map(str, peaks.shape[d])) for d in (a, b)}
    return (Estimate(value, min(alo / bhi, value), max(ahi / blo, value)),
            f"the shape search's best {a.upper()} shape ({shape[a]}) against {b.upper()}'s best ({shape[b]}), each the "
            "best of its rounds; interval: their rounds' ranges")


def tflops_ratio(cmp: Any) -> Estimate:
    """after TFLOP/s ÷ before TFLOP/s of a Comparison whose sides do different FLOPs, with the interval of the
    speedup (interleaved rounds or quartiles): TFLOP/s ratio = speedup × after FLOPs / before FLOPs."""
    fb, fa = cmp.before.flops, cmp.after.flops
    if not fb or not fa:
        raise ValueError("both sides of the comparison need flops for a TFLOP/s ratio")
    return cmp.estimate().map(lambda s: s * fa / fb)


def record_the_rest(lesson: Any) -> None:
    """Claims about instructions, kernel names and tools (not tested), and other systems' MFU (not comparable)."""
    for key, why in UNTESTABLE.items():
        lesson.untested(key, why)
    for i, system in OTHER_SYSTEMS.items():
        lesson.not_comparable(f"mfu_{i}", None, f"{system}: another model and GPU; notebook 01 measures a GPT "
                              "training step's MFU on this GPU")


# ---------------------------------------------------------------- figures and tables (they record nothing)


def _show() -> None:
    import matplotlib.pyplot as plt
    plt.show()


def sweep_figures(sweep: Any, device: Any, peaks: Any, low: str, ref_sweep: Any) -> None:
    """Throughput, and share of each dtype's peak, by size (one colour per dtype; the reference's BF16 dashed)."""
    import matplotlib.pyplot as plt

    dtypes = sweep.measured_dtypes()
    use_ds = any(p.frac_datasheet is not None for p in sweep.points)
    attr, what = ("frac_datasheet", "datasheet") if use_ds else ("frac_measured", "measured")
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.2), layout="constrained")
    for ax, (field, scale, ylabel) in zip(axes, (("tflops", 1, "achieved TFLOP/s"),
                                                 (attr, 100, f"% of the {what} peak of the dtype"))):
        for d in dtypes:
            pts = [(n, v * scale) for n, v in zip(sweep.sizes, sweep.series(d, field)) if v is not None]
            if pts:
                ax.plot(*zip(*pts), marker="o", color=COLORS.get(d), label=d.upper())
        if ref_sweep is not None:
            pts = [(n, v * scale) for n, v in zip(ref_sweep.sizes, ref_sweep.series("bf16", field)) if v is not None]
            if pts:
                ax.plot(*zip(*pts), ls="--", color=COLORS["bf16"], alpha=0.6, label="BF16, reference GPU")
        ax.set(xscale="log", xlabel="n (n×n×n matmul)", ylabel=ylabel)
        ax.set_xticks(list(sweep.sizes), [str(n) for n in sweep.sizes])  # the sizes swept, not 3×10² ...
        ax.minorticks_off()
        ax.grid(alpha=0.3)
    axes[0].set_yscale("log")
    if low in peaks.tflops:
        axes[0].axhline(peaks.tflops[low], color="k", lw=0.8, ls=":", label=f"measured {low.upper()} peak")
    axes[1].set_ylim(0, 110)
    axes[0].legend(fontsize=8)
    fig.suptitle(f"matmul throughput on {device.name}")
    _show()


def roofline(sweep: Any, peaks: Any, dtype: str, title: str) -> str:
    """Draw the roofline of `dtype`'s sweep points under the measured ceilings; return its table (markdown)."""
    from ..display import plots

    pts = [p for p in sweep.points if p.dtype == dtype]
    if not (pts and peaks.copy_gbs and dtype in peaks.tflops):
        return ""
    peak = peaks.tflops[dtype]
    fig = plots.roofline([(str(p.n), p.intensity, p.tflops) for p in pts], peak_tflops=peak,
                         bandwidth_gbs=peaks.copy_gbs, title=title, color=COLORS.get(dtype))  # the dtype's colour
    ridge = peak * 1e12 / (peaks.copy_gbs * 1e9)
    ax = fig.axes[0]  # the legend names the points' colour and the dotted ridge line too
    ax.collections[0].set_label(f"{dtype.upper()} n×n×n matmul (labelled by n)")
    ax.lines[-1].set_label(f"ridge point: {si(ridge)} FLOPs/byte")
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    _show()
    rows = []
    for p in pts:
        roof = min(peak, p.intensity * peaks.copy_gbs / 1e3)
        rows.append(f"| {p.n} | {si(p.intensity)} | {'memory' if p.intensity < ridge else 'compute'}-bound | "
                    f"{si(roof * 1e12, 'FLOP/s')} | {si(p.tflops * 1e12, 'FLOP/s')} | {pct(p.tflops / roof)} |")
    return (f"Ridge point: {si(ridge)} FLOPs/byte ({si(peak * 1e12, 'FLOP/s')} ÷ {si(peaks.copy_gbs * 1e9, 'B/s')}, "
            "both measured).\n\n| n | FLOPs/byte | by the roofline | roof | achieved | share of roof |\n"
            "| --- | --- | --- | --- | --- | --- |\n" + "\n".join(rows))


def dtype_table(times: dict[str, Any], flops: float, names: dict[str, str] | None = None) -> str:
    """Each dtype's matmul time and FLOP/s, and its speed over FP32 (TF32 off) and over TF32 (markdown); `names`
    relabels a row (the `tf32` side run with TF32 off, say)."""
    names = names or {}
    base = {b: times[b].median for b in ("fp32", "tf32") if b in times}
    rows = [f"| {names.get(d, d.upper())} | {si(m.median, 's')} | {si(flops / m.median, 'FLOP/s')} | "
            + " | ".join(ratio(base[b] / m.median) if b in base else "n/a" for b in ("fp32", "tf32")) + " |"
            for d, m in times.items()]
    return (f"| dtype | time (median) | achieved | over FP32 (TF32 off) | over {names.get('tf32', 'TF32')} |\n"
            "| --- | --- | --- | --- | --- |\n"
            + "\n".join(rows))


# Alignment pairs far from their 1.05x bar on the reference H200 (4095³ vs 4096³ read 4.46x [4.46, 4.58], MLP hidden
# 770 vs 768 2.62x [2.57, 2.66]): FEW_ROUNDS rounds (three ratios, their range) still clear it many times over; batch
# and sequence length (0.99x [0.99, 1.02] and 1.02x [0.98, 1.03]) sit near it and keep ROUNDS.
FAR_FROM_BAND = ("square matmul", "hidden size")


def alignment_pairs(bad: dict[str, int], align_n: int, batch: int, seq: int, hidden: int, heads: int, dtype: str,
                    device: Any) -> dict[str, tuple]:
    """{dimension: (misaligned fn, its FLOPs, aligned fn, its FLOPs, labels)} for the four alignment pairs."""
    from ..workloads.matmuls import Matmul, block_forward, mlp_forward

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
    """A bar chart of aligned ÷ misaligned TFLOP/s with its intervals (the reference's beside); returns a table."""
    from ..display import plots
    from ..verdicts.results import comparisons

    ref_ratio = None
    if ref:
        rc = {c.name: c for c in comparisons(ref)}
        ref_ratio = [rc[c.name].after.tflops / rc[c.name].before.tflops if c.name in rc and rc[c.name].before.tflops
                     else None for c in align.values()]
    fig = plots.bars(list(ratio_est), [e.value for e in ratio_est.values()], ylabel="aligned ÷ misaligned TFLOP/s",
                     title=f"alignment: throughput per FLOP ({dtype.upper()})", fmt="{:.3g}x", ref=ref_ratio,
                     err=[(e.lo, e.hi) for e in ratio_est.values()])
    ax = fig.axes[0]
    ax.axhline(1.0, color="k", lw=0.8, label="no difference (1x)")
    ax.axhline(1.05, color="#b42318", lw=0.8, ls=":", label="the claims' band: >= 1.05x")
    ax.legend(fontsize=8)
    fig.tight_layout()
    _show()
    rows = "".join(f"<tr><td style='text-align:left'>{w}</td><td>{c.before.label}</td>"
                   f"<td>{si(c.before.tflops * 1e12, 'FLOP/s')}</td><td>{c.after.label}</td>"
                   f"<td>{si(c.after.tflops * 1e12, 'FLOP/s')}</td><td><b>{ratio(ratio_est[w].value)}</b> "
                   f"[{ratio(ratio_est[w].lo)}, {ratio(ratio_est[w].hi)}]</td></tr>" for w, c in align.items())
    return (f"<b>Alignment, {dtype.upper()}</b><table><tr><th>dimension</th><th>misaligned</th><th>achieved</th>"
            f"<th>aligned</th><th>achieved</th><th>aligned ÷ misaligned [interval]</th></tr>{rows}</table>")


def formats_note(formats: Sequence[Any]) -> str:
    """FP32's digits by PyTorch's count and by the mantissa's (one line)."""
    import math

    import torch

    f32 = {f.name: f for f in formats}["FP32"]
    res = torch.finfo(torch.float32).resolution
    return (f"`torch.finfo(torch.float32).resolution` = {res:g} ({round(-math.log10(res))} whole digits); "
            f"(mantissa + 1)·log10 2 = {f32.digits:.2f} digits.")
