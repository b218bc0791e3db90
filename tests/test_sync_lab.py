"""sync_lab on the CPU: every loop variant computes the same thing; CUDA-only helpers refuse clearly."""
from __future__ import annotations

import pytest
import torch

from gpulab.lessons import sync_lab as sl
from gpulab.workloads import GPT, GPTConfig

CFG = GPTConfig(vocab_size=64, n_layer=1, n_head=2, n_embd=16, block_size=16)


def _loop(seed: int = 0) -> sl.TrainLoop:
    torch.manual_seed(seed)
    batches = sl.token_batches(3, batch=2, seq=8, vocab=CFG.vocab_size, device="cpu", seed=1)
    return sl.TrainLoop(GPT(CFG), batches, lr=1e-3)


def test_token_batches():
    b = sl.token_batches(2, batch=3, seq=5, vocab=10, device="cpu", pad_fraction=0.5)
    assert len(b) == 2
    x, y, m = b[0]
    assert x.shape == y.shape == m.shape == (3, 5) and m.dtype == torch.bool
    assert int(x.max()) < 10 and x.dtype == torch.long
    with pytest.raises(ValueError, match="batch"):
        sl.token_batches(1, batch=0, seq=5, vocab=10, device="cpu")
    with pytest.raises(ValueError, match="pad_fraction"):
        sl.token_batches(1, batch=1, seq=5, vocab=10, device="cpu", pad_fraction=1.0)


def test_masked_mean_index_and_where_agree():
    v = torch.randn(100)
    m = torch.rand(100) > 0.3
    torch.testing.assert_close(sl.masked_mean(v, m, "index"), sl.masked_mean(v, m, "where"))
    torch.testing.assert_close(sl.masked_mean(v, m, "none"), v.mean())
    assert float(sl.masked_mean(v, torch.zeros(100, dtype=torch.bool), "where")) == 0.0  # no NaN on empty masks
    with pytest.raises(ValueError, match="how"):
        sl.masked_mean(v, m, "gather")


@pytest.mark.parametrize("other", ["item_twice", "gpu"])
def test_logging_habits_do_not_change_the_training(other):
    a, b = _loop(), _loop()
    la = [a.run(2, log="item_once") for _ in range(2)]
    lb = [b.run(2, log=other) for _ in range(2)]
    assert la == pytest.approx(lb, rel=1e-5)
    assert la[1] < la[0] * 1.5  # a finite, sane loss
    assert a.last_postfix.startswith("loss=")
    assert _loop().run(1, log="none") is None


def test_mask_index_and_where_train_identically():
    a, b = _loop(), _loop()
    assert a.run(3, log="item_once", mask="index") == pytest.approx(b.run(3, log="item_once", mask="where"), rel=1e-5)


def test_set_to_none_false_keeps_zeroed_grads():
    loop = _loop()
    loop.run(1, log="none", set_to_none=False)
    loop.opt.zero_grad(set_to_none=False)
    assert all(p.grad is not None and not p.grad.any() for p in loop.model.parameters())
    a, b = _loop(), _loop()
    assert a.run(2, log="item_once", set_to_none=False) == pytest.approx(b.run(2, log="item_once"), rel=1e-5)


def test_train_fn_validates_now():
    loop = _loop()
    f = loop.fn(2, log="gpu")
    assert isinstance(f(), float)
    with pytest.raises(ValueError, match="log"):
        loop.fn(2, log="print")
    with pytest.raises(ValueError, match="mask"):
        loop.run(2, mask="gather")
    with pytest.raises(ValueError, match="steps"):
        loop.run(0)
    with pytest.raises(ValueError, match="batches"):
        sl.TrainLoop(GPT(CFG), [])


def test_eval_transfer_once_matches_per_batch():
    loop = _loop()
    per = sl.eval_fn(loop.model, loop.batches, transfer="per_batch")
    once = sl.eval_fn(loop.model, loop.batches, transfer="once")
    assert 0.0 <= per() <= 1.0 and per() == once()
    assert loop.model.training  # eval restores the mode it found
    with pytest.raises(ValueError, match="transfer"):
        sl.eval_fn(loop.model, loop.batches, transfer="never")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU guards")
def test_cuda_only_helpers_refuse_on_cpu():
    with pytest.raises(RuntimeError, match="CUDA"):
        sl.h2d_fns(1024)
    with pytest.raises(RuntimeError, match="CUDA"):
        sl.copy_timing(lambda: None, 4)
    with pytest.raises(RuntimeError, match="CUDA"):
        sl.CopyComputeOverlap(2, 1)
    with pytest.raises(RuntimeError, match="CUDA"):
        sl.busy_work(0.01)
    with pytest.raises(RuntimeError, match="CUDA"):
        sl.queued_copy_timing(lambda: None, lambda: None)


def test_copy_timing_properties():
    t = sl.CopyTiming("pinned", host_s=1e-5, device_s=1e-3, nbytes=10**6)
    assert t.gbs == pytest.approx(1.0) and t.host_fraction == pytest.approx(0.01)
    assert t.to_dict()["gbs"] == pytest.approx(1.0)


def test_copy_timing_fraction_interval_from_repeats():
    t = sl.CopyTiming("pageable", host_s=1e-3, device_s=1e-3, nbytes=10**6, fractions=[0.9, 1.0, 0.99, 0.98, 1.01])
    e = t.fraction_estimate()
    assert e.lo <= e.value <= e.hi and e.value == pytest.approx(0.99)
    assert e.lo == pytest.approx(0.98) and e.hi == pytest.approx(1.0)
    bare = sl.CopyTiming("x", host_s=2e-3, device_s=4e-3, nbytes=1)
    assert bare.fraction_estimate().interval == (0.5, 0.5)  # no repeats kept: the ratio of medians, no spread


def test_queued_copy_waited_fraction():
    # pageable-like: the call returned only after 20 ms of queued work and a 5 ms copy
    q = sl.QueuedCopyTiming("pageable", host_s=[0.025, 0.0249, 0.0251], queued_s=[0.02] * 3, copy_s=[0.005] * 3)
    assert q.waited == pytest.approx([1.0, 0.996, 1.004])
    e = q.estimate()
    assert e.value == pytest.approx(1.0) and e.lo < 1.0 < e.hi
    # pinned-like: it returned after 20 us while the GPU had 25 ms to go
    p = sl.QueuedCopyTiming("pinned", host_s=[2e-5] * 4, queued_s=[0.02] * 4, copy_s=[0.005] * 4)
    assert p.estimate().hi == pytest.approx(0.0008)
    d = p.to_dict()
    assert d["waited_median"] == pytest.approx(0.0008) and len(d["host_s"]) == 4
    assert q.medians() == pytest.approx({"host_s": 0.025, "queued_s": 0.02, "copy_s": 0.005})
    assert d["median_host_s"] == pytest.approx(2e-5)


@pytest.mark.parametrize("log", ["cpu", "branch"])
def test_sync_probe_modes_train_the_same(log):
    a, b = _loop(), _loop()
    assert a.run(2, log=log) is None
    b.run(2, log="none")
    for pa, pb in zip(a.model.parameters(), b.model.parameters()):
        torch.testing.assert_close(pa, pb)
    assert _loop().fn(1, log="cpu")() is None


def test_hidden_share_interval():
    from gpulab.claims import Estimate
    # serial 21 ms, overlapped 12 ms, the shorter task 10 ms: 9 ms of it hidden, 90%
    e = sl.hidden_share(Estimate(21 / 12, 20 / 12, 22 / 12), 0.012, Estimate(0.010, 0.0095, 0.0105))
    assert e.value == pytest.approx(90.0)
    assert e.lo == pytest.approx(8 / 10.5 * 100) and e.hi == pytest.approx(10 / 9.5 * 100)
    with pytest.raises(ValueError):
        sl.hidden_share(Estimate.exact(2.0), 0.0, Estimate.exact(1.0))


def test_count_syncs_is_empty_without_cuda():
    if torch.cuda.is_available():
        pytest.skip("checks the CPU path")
    assert sl.count_syncs({"item": lambda: torch.ones(1).item()}) == {}
