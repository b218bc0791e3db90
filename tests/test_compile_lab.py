"""compile_lab on the CPU: traffic counting, compile degradation, CUDA-only guards, the capped subprocess."""
from __future__ import annotations

import pytest
import torch

from gpulab.lessons import compile_lab as cl

TINY = dict(vocab_size=64, n_layer=1, n_head=2, n_embd=16, block_size=16)


def test_add_relu_mul_matches_formula():
    x, b, s = torch.randn(4, 8), torch.randn(8), torch.randn(8)
    torch.testing.assert_close(cl.add_relu_mul(x, b, s), torch.relu(x + b) * s)


def test_gelu_traffic_counts_eight_ops_and_nine_times_the_fused_bytes():
    x = torch.randn(1000)
    t = cl.eager_traffic(cl.gelu_tanh, x)
    assert t.n_ops == 8, t.ops
    assert t.ideal_bytes == 2 * 1000 * 4  # read x once, write the result once
    assert t.total_bytes == 18 * 1000 * 4  # 8 ops: six one-input ops (2 passes), two two-input ops (3 passes)
    assert t.ratio == pytest.approx(9.0)
    assert "aten.tanh" in t._repr_html_() and "9.00x" in repr(t)
    assert t.to_dict()["n_ops"] == 8


def test_add_relu_mul_traffic_is_about_three_times_fused():
    n, c = 4096, 64
    x, b, s = torch.randn(n, c), torch.randn(c), torch.randn(c)
    t = cl.eager_traffic(cl.add_relu_mul, x, b, s)
    assert [name for name, _ in t.ops] == ["add", "relu", "mul"]
    assert t.total_bytes == (6 * n * c + 2 * c) * 4
    assert t.ideal_bytes == (2 * n * c + 2 * c) * 4
    assert 2.9 < t.ratio < 3.0


def test_views_and_broadcasts_move_no_extra_bytes():
    x = torch.randn(32, 8)
    t = cl.eager_traffic(lambda a: a.view(-1).t() * 2, x)
    assert t.n_ops == 1 and t.total_bytes == 2 * x.numel() * 4
    assert cl._nbytes(torch.randn(8).expand(100, 8)) == 8 * 4


def test_compiler_available_says_why():
    ok, why = cl.compiler_available("cpu")
    assert isinstance(ok, bool) and why


def test_try_compile_without_compiler_degrades(monkeypatch):
    monkeypatch.setattr(cl, "compiler_available", lambda device=None: (False, "no C++ compiler found"))
    r = cl.try_compile(cl.gelu_tanh, torch.randn(16))
    assert not r and not r.ok and r.fn is None and "C++" in r.reason
    assert "not compiled" in repr(r) and "not compiled" in r._repr_html_()
    with pytest.raises(RuntimeError, match="no compiled function"):
        r(torch.randn(16))
    assert "fn" not in r.to_dict()


def test_try_compile_times_the_first_call_and_checks_against_eager():
    x = torch.randn(256)
    r = cl.try_compile(cl.gelu_tanh, x, backend="eager")  # dynamo only: fast, no C++ compile
    assert r.ok and r.compile_s > 0 and r.kernels is None
    assert r.max_abs_err == pytest.approx(0.0, abs=1e-6)
    torch.testing.assert_close(r(x), cl.gelu_tanh(x))
    assert "first call" in repr(r)


def test_try_compile_reports_a_failing_backend():
    def broken(gm, example_inputs):
        raise RuntimeError("toolchain exploded")

    r = cl.try_compile(lambda x: x * 2 + 1, torch.randn(8), backend=broken)
    assert not r.ok and "toolchain exploded" in r.reason


def test_try_compile_first_call_runs_backward():
    lin = torch.nn.Linear(4, 4)
    x = torch.randn(2, 4)
    r = cl.try_compile(lin, backend="eager", first_call=lambda m: m(x).sum().backward())
    assert r.ok and r.max_abs_err is None and lin.weight.grad is not None


def test_try_compile_rejects_unknown_mode():
    with pytest.raises(ValueError, match="mode"):
        cl.try_compile(cl.gelu_tanh, torch.randn(4), mode="fastest")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU guard")
def test_cuda_graphs_need_cuda():
    with pytest.raises(RuntimeError, match="CUDA"):
        cl.CUDAGraphed(lambda: torch.randn(2))


def test_gpt_forward_workload():
    model, idx = cl.gpt_forward_workload(TINY, batch=2, seq=8, dtype="fp32", device="cpu")
    assert idx.shape == (2, 8) and not model.training
    logits, loss = model(idx)
    assert logits.shape == (2, 8, 64) and loss is None
    with pytest.raises(ValueError, match="block_size"):
        cl.gpt_forward_workload(TINY, batch=1, seq=32, device="cpu")
    with pytest.raises(ValueError, match="dtype"):
        cl.gpt_forward_workload(TINY, batch=1, seq=8, dtype="int8", device="cpu")


def test_mode_timing_round_trips():
    m = cl.ModeTiming("default", True, compile_s=1.5, median_s=0.01)
    assert cl.ModeTiming.from_dict(m.to_dict()) == m


def test_time_mode_in_subprocess_eager_on_cpu():
    wl = dict(config=TINY, batch=2, seq=8, dtype="fp32", device="cpu")
    r = cl.time_mode_in_subprocess(wl, "eager", timeout_s=120, min_time_s=0.02)
    assert r.ok, r.reason
    assert r.median_s > 0 and r.compile_s is None and r.wall_s > 0
    r = cl.time_mode_in_subprocess(wl, "cuda-graph", timeout_s=120, min_time_s=0.02)
    if not torch.cuda.is_available():
        assert not r.ok and "CUDA" in r.reason


def test_time_mode_in_subprocess_is_capped():
    wl = dict(config=TINY, batch=2, seq=8, dtype="fp32", device="cpu")
    r = cl.time_mode_in_subprocess(wl, "eager", timeout_s=0.2)
    assert not r.ok and "budget" in r.reason and r.wall_s < 30


def test_time_mode_in_subprocess_validates():
    with pytest.raises(ValueError, match="mode"):
        cl.time_mode_in_subprocess({}, "fast", timeout_s=1)
    with pytest.raises(ValueError, match="timeout_s"):
        cl.time_mode_in_subprocess({}, "eager", timeout_s=0)


def test_time_mode_in_subprocess_reports_child_errors():
    r = cl.time_mode_in_subprocess(dict(config={"n_embd": 7, "n_head": 2}, batch=1, seq=4), "eager", timeout_s=120)
    assert not r.ok and "n_embd" in r.reason

