"""sync_lab on the CPU: every loop variant computes the same thing; CUDA-only helpers refuse clearly."""
from __future__ import annotations

import pytest
import torch

from gpulab import sync_lab as sl
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


def test_copy_timing_properties():
    t = sl.CopyTiming("pinned", host_s=1e-5, device_s=1e-3, nbytes=10**6)
    assert t.gbs == pytest.approx(1.0) and t.host_fraction == pytest.approx(0.01)
    assert t.to_dict()["gbs"] == pytest.approx(1.0)
