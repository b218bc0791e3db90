"""The fused lm_head + cross-entropy: the same loss and gradients as the ordinary path."""
import pytest
import torch
import torch.nn.functional as F

from gpulab.workloads import fused_loss as FL
from gpulab.workloads import training as T
from gpulab.workloads.models import GPT, GPTConfig


def _inputs(n=37, c=16, v=70, device="cpu", seed=0):
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(n, c, generator=g).to(device).requires_grad_()
    w = (torch.randn(v, c, generator=g) * 0.5).to(device).requires_grad_()
    t = torch.randint(0, v, (n,), generator=g).to(device)
    return h, w, t


def _both(h, w, t, multiplier=1.0, autocast=None):
    device = h.device.type
    out = []
    for fn in (FL.linear_cross_entropy, lambda a, b, c: F.cross_entropy(F.linear(a, b), c)):
        with torch.autocast(device, dtype=autocast or torch.bfloat16, enabled=autocast is not None):
            loss = fn(h, w, t)
        out.append((loss, *torch.autograd.grad(loss * multiplier, (h, w))))
    return out


@pytest.mark.parametrize("multiplier", [1.0, 3.5])
def test_matches_ordinary_cross_entropy_in_fp32(multiplier):
    (l1, gh1, gw1), (l2, gh2, gw2) = _both(*_inputs(), multiplier=multiplier)
    torch.testing.assert_close(l1, l2)
    torch.testing.assert_close(gh1, gh2)
    torch.testing.assert_close(gw1, gw2)


def test_bf16_autocast_matches_and_keeps_input_dtypes():
    (l1, gh1, gw1), (l2, gh2, gw2) = _both(*_inputs(), autocast=torch.bfloat16)
    assert l1.dtype == torch.float32 and gh1.dtype == gw1.dtype == torch.float32
    torch.testing.assert_close(l1, l2, rtol=1e-2, atol=1e-2)
    torch.testing.assert_close(gh1, gh2, rtol=2e-2, atol=2e-3)
    torch.testing.assert_close(gw1, gw2, rtol=2e-2, atol=2e-3)


def test_fp16_takes_the_ordinary_path():
    h, w, t = _inputs()
    with torch.autocast("cpu", dtype=torch.float16):
        fused, plain = FL.linear_cross_entropy(h, w, t), F.cross_entropy(F.linear(h, w), t)
    assert torch.equal(fused, plain)


def test_reference_path_writes_the_gradient_over_the_logits():
    logits = torch.randn(5, 9)
    targets = torch.tensor([0, 8, 3, 3, 1])
    expected_loss = F.cross_entropy(logits, targets, reduction="none")
    expected_grad = (torch.softmax(logits, -1) - F.one_hot(targets, 9)) * 0.25
    losses = FL._loss_and_grad(logits, targets, 0.25)  # no CUDA here: the PyTorch-ops path
    torch.testing.assert_close(losses, expected_loss)
    torch.testing.assert_close(logits, expected_grad)


def test_bad_shapes_are_refused_before_any_work():
    h, w, t = _inputs()
    with pytest.raises(ValueError, match="must share C"):
        FL.linear_cross_entropy(h, w[:, :-1], t)
    with pytest.raises(ValueError, match="targets must have shape"):
        FL.linear_cross_entropy(h, w, t[:-1])


def test_kernel_reported_unavailable_without_cuda():
    assert not FL.fused_kernel_available("cpu")
    assert "needs a CUDA GPU" in FL.kernel_status("cpu")


def test_a_failing_kernel_falls_back_with_a_warning(monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("cannot compile")

    class FakeKernel:
        def __getitem__(self, grid):
            return broken

    class CudaLike(torch.Tensor):  # a CPU tensor that says it is on CUDA, to reach the kernel branch
        @property
        def is_cuda(self):
            return True

    monkeypatch.setattr(FL, "_triton", lambda: FakeKernel())
    monkeypatch.setattr(FL, "_kernel_error", None)
    logits = torch.randn(4, 6)
    targets = torch.tensor([0, 1, 2, 5])
    expected = F.cross_entropy(logits, targets, reduction="none")
    with pytest.warns(RuntimeWarning, match="cannot compile"):
        losses = FL._loss_and_grad(logits.as_subclass(CudaLike), targets, 1.0)
    torch.testing.assert_close(losses.as_subclass(torch.Tensor), expected)
    assert FL._kernel_error and "cannot compile" in FL._kernel_error


def test_gpt_with_fused_loss_trains_like_the_ordinary_gpt():
    cfg = GPTConfig.smoke(vocab_size=320, block_size=32, n_embd=32)
    a, b = GPT(cfg), GPT(cfg, fused_loss=True)
    b.load_state_dict(a.state_dict())
    idx = torch.randint(0, 320, (3, 32), generator=torch.Generator().manual_seed(1))
    tgt = idx.roll(-1, dims=1)
    logits_a, loss_a = a(idx, tgt)
    logits_b, loss_b = b(idx, tgt)
    assert logits_b is None and logits_a.shape == (3, 32, 320)
    torch.testing.assert_close(loss_b, loss_a)
    loss_a.backward()
    loss_b.backward()
    for (name, pa), pb in zip(a.named_parameters(), b.parameters()):
        torch.testing.assert_close(pb.grad, pa.grad, msg=name)
    assert b(idx)[0].shape == (3, 32, 320)  # without targets: logits as usual


def test_train_config_switch_and_label():
    cfg = T.TrainConfig(model=GPTConfig.smoke(vocab_size=300, block_size=32), fused_loss=True)
    assert T.build_model(cfg).fused_loss and "fused loss" in T.describe(cfg)
    assert cfg.flops_per_token() == cfg.replace(fused_loss=False).flops_per_token()


@pytest.mark.skipif(not FL.fused_kernel_available(), reason="needs a CUDA GPU with Triton")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_triton_kernel_matches_reference_path(dtype):
    n, v = 300, 50304 + 17  # a last block that is partly masked
    logits = torch.randn(n, v, device="cuda", dtype=dtype) * 4
    targets = torch.randint(0, v, (n,), device="cuda")
    ref = logits.clone()
    ref_losses = FL._loss_and_grad_torch(ref, targets, 1 / n)
    losses = FL._loss_and_grad(logits, targets, 1 / n)
    assert FL.fused_kernel_available()  # it ran, rather than falling back
    torch.testing.assert_close(losses, ref_losses, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(logits.float(), ref.float(), rtol=1e-2, atol=1e-6)
