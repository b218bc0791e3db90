import json
import math

import pytest
import torch

from gpulab.workloads import matmuls as ml
from gpulab.workloads import number_formats as nf
from gpulab.measuring.device import DeviceInfo, lookup_peaks

CPU = DeviceInfo(kind="cpu", name="test cpu")


def gpu(cap, name="NVIDIA H100 80GB HBM3"):
    return DeviceInfo(kind="cuda", name=name, index=0, capability=cap, datasheet_peaks=lookup_peaks(name))


def test_intensity_of_a_square_matmul_is_2n_over_3b():
    assert ml.matmul_intensity(4096, "bf16") == pytest.approx(2 * 4096 / (3 * 2))
    assert ml.matmul_intensity(4096, "fp32") == pytest.approx(2 * 4096 / (3 * 4))
    assert ml.matmul_intensity(4096, "tf32") == ml.matmul_intensity(4096, "fp32")  # TF32 stores FP32
    # FP8 reads 1-byte operands but writes a BF16 result.
    assert ml.matmul_intensity(1024, "fp8") == pytest.approx(2 * 1024**3 / (2 * 1024**2 + 2 * 1024**2))
    assert ml.matmul_intensity(1024, "fp8", out_bytes=1) == pytest.approx(2 * 1024 / 3)
    assert ml.matmul_intensity(8, "fp32", m=4, k=2) == pytest.approx(2 * 4 * 8 * 2 / ((8 + 16 + 32) * 4))
    with pytest.raises(ValueError, match="dtype"):
        ml.matmul_intensity(8, "int4")
    with pytest.raises(ValueError):
        ml.matmul_intensity(0, "bf16")


def test_dtype_support_follows_capability():
    assert ml.dtype_support(CPU, "fp32") is None and ml.dtype_support(CPU, "bf16") is None
    assert "CUDA" in ml.dtype_support(CPU, "tf32") and "CUDA" in ml.dtype_support(CPU, "fp8")
    assert ml.dtype_support(gpu((9, 0)), "fp8") is None
    assert "sm_89" in ml.dtype_support(gpu((8, 0), "NVIDIA A100-SXM4-80GB"), "fp8")
    assert "sm_80" in ml.dtype_support(gpu((7, 5), "Tesla T4"), "bf16")
    assert ml.dtype_support(gpu((7, 5), "Tesla T4"), "fp16") is None


def test_fp8_models_come_from_the_datasheet_table():
    models = ml.fp8_datasheet_models()
    assert "H100 SXM" in models and "L4" in models and "L40S" in models
    assert not any(m.startswith("A100") for m in models)


def test_format_table_from_finfo():
    rows = {r.name: r for r in nf.format_table()}
    f32, tf32, bf16, f16 = rows["FP32"], rows["TF32"], rows["BF16"], rows["FP16"]
    assert (f32.bits, f32.exponent_bits, f32.mantissa_bits) == (32, 8, 23)
    assert (bf16.bits, bf16.exponent_bits, bf16.mantissa_bits) == (16, 8, 7)
    assert (f16.bits, f16.exponent_bits, f16.mantissa_bits) == (16, 5, 10)
    assert (tf32.bits, tf32.exponent_bits, tf32.mantissa_bits) == (19, 8, 10) and tf32.torch_dtype is None
    assert tf32.eps == 2**-10 == f16.eps
    assert tf32.smallest_normal == f32.smallest_normal and tf32.max == pytest.approx(f32.max, rel=1e-3)
    assert f16.max == 65504 and f32.digits == pytest.approx(24 * math.log10(2))
    if "FP8 E4M3" in rows:
        e4 = rows["FP8 E4M3"]
        assert (e4.exponent_bits, e4.mantissa_bits, e4.max) == (4, 3, 448)
        assert rows["FP8 E5M2"].max == 57344
    json.dumps([r.to_dict() for r in rows.values()])
    assert "<table>" in nf.formats_html(list(rows.values()))


def test_format_mismatches_flags_only_wrong_fields():
    rows = {r.name: r for r in nf.format_table()}
    assert nf.format_mismatches(rows["FP32"], exponent_bits=8, mantissa_bits=23, max_abs=3.4e38, digits=7) == []
    assert nf.format_mismatches(rows["BF16"], exponent_bits=8, mantissa_bits=7, max_abs=3.4e38, digits=2) == []
    assert nf.format_mismatches(rows["FP16"], exponent_bits=5, mantissa_bits=10, max_abs=65504, digits=3) == []
    bad = nf.format_mismatches(rows["FP16"], exponent_bits=8, mantissa_bits=10, max_abs=3.4e38, digits=4)
    assert len(bad) == 3 and any("exponent" in b for b in bad) and any("digits" in b for b in bad)


def test_matmul_callable_on_cpu_is_random_and_correct():
    mm = ml.Matmul(32, "fp32", "cpu", m=8, k=16)
    out = mm()
    assert out.shape == (8, 32) and mm.flops == 2 * 8 * 32 * 16
    assert torch.allclose(out, mm.a @ mm.b) and mm.a.abs().sum() > 0
    assert ml.Matmul(16, "bf16", "cpu")().dtype == torch.bfloat16
    with pytest.raises(ValueError, match="fp8"):
        ml.Matmul(16, "fp8", "cpu")
    with pytest.raises(ValueError):
        ml.Matmul(0, "fp32", "cpu")


def test_measure_and_sweep_on_cpu_skip_what_cannot_run():
    pt = ml.measure_matmul(32, "fp32", CPU, min_time_s=0.01)
    assert pt.tflops > 0 and pt.seconds > 0 and pt.frac_datasheet is None
    with pytest.raises(ValueError, match="tf32"):
        ml.measure_matmul(32, "tf32", CPU, min_time_s=0.01)
    sw = ml.sweep_matmul([16, 32], ["fp32", "tf32", "bf16", "fp8"], CPU, min_time_s=0.01, progress=False)
    assert set(sw.skipped) == {"tf32", "fp8"}
    assert sw.measured_dtypes() == ["fp32", "bf16"]
    assert len(sw.series("fp32")) == 2 and sw.series("tf32") == [None, None]
    assert sw.best("bf16").dtype == "bf16" and sw.best("tf32") is None
    back = ml.MatmulSweep.from_dict(json.loads(json.dumps(sw.to_dict())))
    assert back.series("fp32") == sw.series("fp32") and back.skipped == sw.skipped
    assert "<table>" in sw._repr_html_()
    with pytest.raises(ValueError):
        ml.sweep_matmul([], ["fp32"], CPU)


def test_fmt_tflops_reads_at_any_scale():
    assert ml.fmt_tflops(797.34) == "797" and ml.fmt_tflops(1244.6) == "1,240"
    assert ml.fmt_tflops(0.03125) == "0.0312" and ml.fmt_tflops(None) == "n/a"


def test_point_fractions():
    p = ml.MatmulPoint(n=8, dtype="bf16", seconds=1.0, iqr_s=0.0, tflops=500.0, intensity=1.0,
                       datasheet_tflops=1000.0, measured_peak_tflops=800.0)
    assert p.frac_datasheet == 0.5 and p.frac_measured == 0.625
    assert ml.MatmulPoint.from_dict(p.to_dict()) == p


def test_layers_for_alignment_count_flops_like_the_formula():
    from gpulab.measuring.flops import count_flops
    run, flops = ml.mlp_forward(16, 24, "fp32", "cpu")
    assert run().shape == (16, 24)
    assert count_flops(run).total == flops == 16 * 16 * 24**2
    run, flops = ml.block_forward(2, 16, n_embd=32, n_head=4, dtype="fp32", device="cpu")
    assert run().shape == (2, 16, 32)
    assert flops == 24 * 2 * 16 * 32**2 + 4 * 2 * 16**2 * 32


def test_tiny_matmuls_python_loop_on_cpu():
    t = ml.TinyMatmuls(5, 8, "fp32", "cpu")
    t()
    assert t.flops == 5 * 2 * 8**3
    assert torch.allclose(t.c, t.a @ t.b)
    with pytest.raises(ValueError, match="CUDA"):
        ml.TinyMatmuls(4, 8, "fp32", "cpu", graph=True)
    with pytest.raises(ValueError):
        ml.TinyMatmuls(0, 8)


def test_fp8_cast_round_trips_within_fp8_precision():
    if not hasattr(torch, "float8_e4m3fn"):
        pytest.skip("no float8 in this torch")
    x = torch.randn(64, 64) * 30
    q, scale = ml.to_fp8(x)
    assert q.dtype == torch.float8_e4m3fn
    back = q.float() * scale
    assert ((back - x).abs() <= 0.07 * x.abs() + 1e-3 * x.abs().max()).all()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_tiny_matmuls_cuda_graph_matches_loop():
    t = ml.TinyMatmuls(8, 64, "bf16", "cuda", graph=True, graph_nodes=4)
    t()
    torch.cuda.synchronize()
    assert t.replays == 2 and torch.allclose(t.c.float(), (t.a @ t.b).float())


def test_measure_matmul_warms_up_on_the_device_clock(monkeypatch):
    """The warm-up is a timed window thrown away (bounded by the matmuls' own time), never benchmark's host-timed
    warm-up, which queues hundreds of big matmuls because launches are asynchronous (20 s at 8192³ FP32 on an H100)."""
    calls = []
    real = ml.benchmark

    def spy(fn, **kw):
        calls.append(kw)
        return real(fn, **kw)

    monkeypatch.setattr(ml, "benchmark", spy)
    ml.measure_matmul(32, "fp32", CPU, min_time_s=0.01, warmup_s=0.02)
    assert [c["min_time_s"] for c in calls] == [0.02, 0.01] and all(c["warmup_s"] == 0 for c in calls)
    calls.clear()
    ml.sweep_matmul([16], ["fp32"], CPU, min_time_s=0.01, warmup_s=0, progress=False)
    assert len(calls) == 1 and calls[0]["warmup_s"] == 0
    with pytest.raises(ValueError, match="warmup_s"):
        ml.measure_matmul(32, "fp32", CPU, warmup_s=-1)
