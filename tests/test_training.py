import json
import math

import pytest
import torch

import gpulab as gl
from gpulab.workloads import training as T
from gpulab.workloads.models import GPT, GPTConfig
from gpulab.workloads.text_data import build_text_corpus


@pytest.fixture(scope="module")
def tokens():
    return torch.frombuffer(bytearray(build_text_corpus(60_000).encode()), dtype=torch.uint8).clone()


def tiny(**overrides):
    model = GPTConfig.smoke(vocab_size=300, block_size=32, n_embd=32)
    return T.TrainConfig(**{**dict(model=model, batch_size=2, warmup_steps=2), **overrides})


@pytest.mark.parametrize("kwargs, name", [
    (dict(batch_size=0), "batch_size"), (dict(grad_accum=-1), "grad_accum"), (dict(seq_len=33), "seq_len"),
    (dict(autocast="fp8"), "autocast"), (dict(param_dtype="fp16"), "param_dtype"), (dict(attn="flash"), "attn"),
    (dict(num_workers=-1), "num_workers"), (dict(lr=0.0), "lr"), (dict(loss_multiplier=float("nan")), "loss_multiplier"),
    (dict(grad_clip=0.0), "grad_clip"), (dict(param_dtype="bf16", autocast="bf16"), "param_dtype"),
    (dict(grad_scaler=True, param_dtype="bf16"), "grad_scaler"), (dict(master_weights=True), "master_weights")])
def test_bad_config_raises_value_error_naming_the_field(kwargs, name):
    with pytest.raises(ValueError, match=name):
        tiny(**kwargs)


def test_config_derived_values():
    cfg = tiny(batch_size=4, grad_accum=3, seq_len=16)
    assert cfg.tokens_per_step == 4 * 3 * 16
    assert cfg.matmul_dtype == "fp32"
    assert cfg.replace(tf32=True).matmul_dtype == "tf32"
    assert cfg.replace(tf32=True, autocast="bf16").matmul_dtype == "bf16"
    assert cfg.replace(param_dtype="bf16").matmul_dtype == "bf16"
    assert cfg.vocab_size == 300 and cfg.replace(pad_vocab=True).vocab_size == 320
    # The padded rows are not useful work: the FLOP count is the unpadded model's.
    assert cfg.replace(pad_vocab=True).flops_per_token() == cfg.flops_per_token()
    assert set(cfg.replace(tf32=True, batch_size=8).changes_from(cfg)) == {"tf32", "batch_size"}
    json.dumps(cfg.to_dict())
    assert T.TrainConfig().model.vocab_size == 50257 and T.TrainConfig().attn == "manual"  # defaults: the naive loop


@pytest.mark.parametrize("bias", [False, True])
def test_gpt_num_params_formula_matches_the_model(bias):
    for cfg in (GPTConfig.smoke(bias=bias), GPTConfig.smoke(n_layer=3, n_embd=96, n_head=4, vocab_size=777, bias=bias)):
        assert T.gpt_num_params(cfg) == GPT(cfg).num_params()


def test_flops_per_token_is_6n_plus_attention():
    cfg = tiny(seq_len=16)
    m = cfg.model
    n = T.gpt_num_params(m)
    assert cfg.flops_per_token() == 6 * n + 12 * m.n_layer * m.n_embd * 16


def test_padded_model_keeps_the_real_rows_and_every_other_weight():
    a, b = T.build_model(tiny()), T.build_model(tiny(pad_vocab=True))
    assert b.wte.weight.shape[0] == 320 and b.lm_head.weight is b.wte.weight
    assert torch.equal(a.wte.weight, b.wte.weight[:300])
    sa, sb = a.state_dict(), b.state_dict()
    for k in sa:
        if k not in ("wte.weight", "lm_head.weight"):
            assert torch.equal(sa[k], sb[k]), k


def test_sync_modes_accumulation_and_workers_see_the_same_data(tokens):
    base = T.train_steps(tiny(), 4, tokens=tokens).losses
    assert len(base) == 4 and all(math.isfinite(v) for v in base)
    assert T.train_steps(tiny(sync_every_step=False), 4, tokens=tokens).losses == pytest.approx(base, abs=1e-6)
    # 2 sequences per step as 1 x 2 accumulated: the same sequences, the same (averaged) gradient.
    assert T.train_steps(tiny(batch_size=1, grad_accum=2), 4, tokens=tokens).losses == pytest.approx(base, rel=1e-4)
    assert T.train_steps(tiny(num_workers=1), 4, tokens=tokens).losses == pytest.approx(base, abs=1e-6)


def test_losses_stay_tensors_without_per_step_sync(tokens):
    with T.Trainer(tiny(sync_every_step=False), tokens) as tr:
        tr.step()
        tr.step()
        assert all(isinstance(v, torch.Tensor) for v in tr._losses)
        assert len(tr.losses()) == 2
    with T.Trainer(tiny(), tokens) as tr:
        tr.step()
        assert isinstance(tr._losses[0], float)


def test_reset_gives_the_same_run_again(tokens):
    with T.Trainer(tiny(fused_adamw=True, lr=3e-3), tokens) as tr:
        for _ in range(8):
            tr.step()
        first = tr.losses()
        tr.reset()
        for _ in range(8):
            tr.step()
        assert tr.losses() == pytest.approx(first, abs=1e-6)
        assert first[-1] < first[0]  # it trains


def test_train_steps_result_and_reuse(tokens):
    cfg = tiny()
    r = T.train_steps(cfg, 5, tokens=tokens, device="cpu", label="tiny", progress=True)
    assert r.steps == 5 and r.step_s > 0 and r.tokens_per_s == pytest.approx(cfg.tokens_per_step / r.step_s)
    assert r.mfu is None and r.peak_memory_gb is None  # no datasheet peak and no GPU memory on a CPU
    assert r.final_loss == pytest.approx(r.losses[-1])
    d = json.loads(json.dumps(r.to_dict()))
    assert T.TrainResult.from_dict(d).summary()["steps"] == 5
    assert "tiny" in repr(r)
    with T.Trainer(cfg, tokens, "cpu") as tr:
        again = T.train_steps(cfg, 5, trainer=tr)
        assert again.losses == pytest.approx(r.losses, abs=1e-6)
        with pytest.raises(ValueError, match="differs"):
            T.train_steps(cfg.replace(lr=1e-3), 2, trainer=tr)
    with pytest.raises(ValueError, match="steps"):
        T.train_steps(cfg, 0, tokens=tokens)
    with pytest.raises(ValueError, match="tokens"):
        T.train_steps(cfg, 2)


@pytest.mark.parametrize("mode", [dict(autocast="fp16", grad_scaler=True), dict(autocast="bf16"),
                                  dict(param_dtype="bf16"), dict(param_dtype="bf16", master_weights=True)])
def test_precision_modes_train_on_cpu(tokens, mode):
    r = T.train_steps(tiny(attn="sdpa", batch_size=1, seq_len=16, **mode), 3, tokens=tokens)
    assert all(math.isfinite(v) for v in r.losses)


def test_format_info_matches_finfo_and_tf32_layout():
    f16, bf16, tf32 = T.format_info("fp16"), T.format_info("bfloat16"), T.format_info("tf32")
    assert (f16.exponent_bits, f16.mantissa_bits, f16.max) == (5, 10, 65504.0)
    assert f16.smallest_subnormal == pytest.approx(2.0**-24)
    assert (bf16.exponent_bits, bf16.mantissa_bits) == (8, 7)
    assert (tf32.exponent_bits, tf32.mantissa_bits) == (8, 10)
    assert tf32.max == pytest.approx(torch.finfo(torch.float32).max, rel=1e-3)
    assert T.format_info("fp32").digits == pytest.approx(7.22, abs=0.01)
    with pytest.raises(ValueError, match="name"):
        T.format_info("fp8")


def test_effective_mantissa_bits_on_cpu():
    assert T.effective_mantissa_bits("fp32", "cpu", n=64) == 23
    assert T.effective_mantissa_bits("bf16", "cpu", n=64) == 7
    assert T.effective_mantissa_bits("fp16", "cpu", n=64) == 10
    assert T.effective_mantissa_bits("tf32", "cpu") is None


def test_gradient_underflow_counts_what_fp16_loses(tokens):
    cfg = GPTConfig.smoke(vocab_size=300, block_size=32, n_embd=32)
    rep = T.gradient_underflow(cfg, tokens, batch_size=2, loss_multiplier=2.0**-12)
    assert rep.row("fp32")["param_grads_zeroed"] == 0
    assert rep.row("fp16_noscale")["logit_grads_zeroed"] > 0.5
    assert rep.row("fp16_scaled")["logit_grads_zeroed"] < 0.01 and rep.scale >= 2.0**10
    assert rep.row("fp16_scaled")["grad_rel_error"] < rep.row("fp16_noscale")["grad_rel_error"]
    assert len(rep.hist_edges) == len(rep.hist_logits) + 1 and sum(rep.hist_params) > 0
    json.dumps(rep.to_dict())
    assert "underflow" in rep._repr_html_().lower()
    fig = T.plot_underflow(rep)
    assert len(fig.axes) == 2
    import matplotlib.pyplot as plt
    plt.close(fig)


def test_waterfall_is_cumulative_one_change_at_a_time():
    naive = tiny(batch_size=2)
    steps = T.waterfall_configs(naive, batch_size=4, grad_accum=2, num_workers=1)
    labels = [s[0] for s in steps]
    assert labels[0] == "naive FP32" and labels[-1] == "+ torch.compile" and len(set(labels)) == len(labels)
    changed = [set(b.changes_from(a)) for (_, a), (_, b) in zip(steps, steps[1:])]
    assert changed == [{"tf32"}, {"autocast"}, {"fused_adamw"}, {"attn"}, {"batch_size", "grad_accum"},
                       {"sync_every_step"}, {"num_workers", "pin_memory"}, {"pad_vocab"}, {"fused_loss"},
                       {"autocast", "param_dtype", "master_weights"}, {"compile"}]
    final = steps[-1][1]
    assert final.compile and final.pad_vocab and final.fused_loss and final.master_weights
    assert final.matmul_dtype == "bf16" and final.autocast is None
    assert T.waterfall_configs(naive, batch_size=4, grad_accum=2, num_workers=1,
                               bf16_weights=False)[-1][1].autocast == "bf16"
    assert not any(c.fused_loss for _, c in T.waterfall_configs(naive, batch_size=4, grad_accum=2, num_workers=1,
                                                                   fused_loss=False))
    assert not any(c.compile for _, c in T.waterfall_configs(naive, batch_size=4, grad_accum=2, num_workers=1,
                                                                compile=False))
    # An already padded vocabulary has no padding step.
    padded = tiny(model=GPTConfig.smoke(vocab_size=320, block_size=32, n_embd=32))
    assert "+ vocab padded to 64x" not in [s[0] for s in T.waterfall_configs(padded, batch_size=4, grad_accum=2,
                                                                              num_workers=0)]


def test_cudnn_attention_step_comes_before_compile_and_is_probed():
    naive = tiny(batch_size=2)
    steps = T.waterfall_configs(naive, batch_size=4, grad_accum=2, num_workers=0, cudnn_attention=True)
    labels = [s[0] for s in steps]
    assert labels[-4:] == ["+ cuDNN attention", "+ fused lm_head + loss", "+ BF16 weights, FP32 master",
                           "+ torch.compile"]
    assert steps[-4][1].changes_from(steps[-5][1]) == {"attn": ("sdpa", "cudnn")}
    assert T.build_model(steps[-4][1]).attn == "sdpa"  # the same module; only the kernel differs
    ok, why = T.cudnn_attention_available("cpu")
    assert not ok and "CUDA" in why
    with pytest.raises(ValueError, match="attn=.*allowed: manual, sdpa, cudnn"):
        tiny(attn="flash")
    with pytest.raises(ValueError, match="compile_mode=.*allowed: default, reduce-overhead"):
        tiny(compile_mode="fast")
    last = T.waterfall_configs(naive, batch_size=4, grad_accum=2, num_workers=0,
                               compile_mode="max-autotune-no-cudagraphs")[-1][1]
    assert last.compile and last.compile_mode == "max-autotune-no-cudagraphs"


def test_halve_batch():
    assert T.halve_batch(tiny(batch_size=8, grad_accum=2)).batch_size == 4
    assert T.halve_batch(tiny(batch_size=8, grad_accum=2)).tokens_per_step == tiny(batch_size=8, grad_accum=2).tokens_per_step
    assert T.halve_batch(tiny(batch_size=1)) is None and T.halve_batch(tiny(batch_size=3)) is None


def test_measure_config_and_per_items(tokens, cpu_device):
    dev = cpu_device
    run, tr = T.measure_config("tiny", tiny(), tokens, device=dev, min_time_s=0.02, monitor=False, keep=True)
    assert tr is not None and tr.model is not None
    tr.close()
    assert tr.model is None
    row = run.row()
    assert row["label"] == "tiny" and row["tokens_per_s"] > 0 and row["mfu_bf16_peak"] is None
    json.dumps(row)
    scaled = T.per_items(run.run, 4 * run.config.tokens_per_step)
    assert scaled.seconds == pytest.approx(4 * run.run.seconds)
    assert scaled.throughput == pytest.approx(run.run.throughput)
    cmp = gl.Comparison(name="x", before=scaled, after=run.run)
    assert cmp.speedup == pytest.approx(4.0)


def test_measure_config_halves_the_batch_on_out_of_memory(tokens, monkeypatch):
    real_step = T.Trainer.step

    def step(self):
        if self.cfg.batch_size > 1:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 1 GiB (simulated)")
        real_step(self)

    monkeypatch.setattr(T.Trainer, "step", step)
    run, _ = T.measure_config("oom", tiny(batch_size=4), tokens, min_time_s=0.02, monitor=False)
    assert run.config.batch_size == 1 and run.config.grad_accum == 4
    assert len(run.notes) == 2 and "out of memory" in run.notes[0]
    monkeypatch.setattr(T.Trainer, "step", lambda self: (_ for _ in ()).throw(RuntimeError("boom")))
    with pytest.raises(RuntimeError, match="boom"):
        T.measure_config("err", tiny(), tokens, min_time_s=0.02, monitor=False)


def test_smooth_and_table():
    assert T.smooth([1, 2, 3, 4], 2) == [1, 1.5, 2.5, 3.5]
    with pytest.raises(ValueError):
        T.smooth([1.0], 0)
    t = T.Table([{"a": 1.2345, "b": None}], [("a", "A", "{:.2f}"), ("b", "B", None)], title="t")
    assert "1.23" in repr(t) and "n/a" in t._repr_html_()


def test_master_weights_keep_updates_that_bf16_rounds_away(tokens):
    # lr 1e-5 against weights of about 0.02: one BF16 ulp there is about 1e-4, so each AdamW update (about lr)
    # rounds away in BF16, while the FP32 master copy accumulates it.
    common = dict(param_dtype="bf16", lr=1e-5, warmup_steps=0, weight_decay=0.0, grad_clip=None)
    changed = {}
    for master in (False, True):
        with T.Trainer(tiny(master_weights=master, **common), tokens) as tr:
            w0 = tr._init_state["blocks.0.mlp.0.weight"].clone()
            for _ in range(5):
                tr.step()
            updated = tr._optimized()["blocks.0.mlp.0.weight"].detach().float().cpu()
            start = w0 if master else w0.to(torch.bfloat16).float()  # what AdamW started from
            changed[master] = (updated - start).abs().mean().item()
            if master:
                w = tr.model.blocks[0].mlp[0].weight
                assert w.dtype == torch.bfloat16 and tr._masters["blocks.0.mlp.0.weight"].dtype == torch.float32
                assert torch.equal(w.cpu(), updated.to(torch.bfloat16))  # the BF16 weights are the masters, rounded
                assert all(p.grad is None for p in tr.model.parameters())
                tr.reset()
                assert torch.equal(tr._masters["blocks.0.mlp.0.weight"].cpu(), w0)
    assert changed[True] > 2e-5  # five steps of about lr each
    assert changed[False] < changed[True] / 2
    assert T.describe(tiny(master_weights=True, param_dtype="bf16")).startswith("BF16 weights + FP32 master")


def test_master_weights_train_like_autocast(tokens):
    losses = {}
    for name, cfg in (("autocast", tiny(autocast="bf16")), ("master", tiny(param_dtype="bf16", master_weights=True))):
        losses[name] = T.train_steps(cfg.replace(lr=3e-3), 20, tokens=tokens).losses
    assert losses["master"][-1] < losses["master"][0] - 0.5  # it learns
    assert abs(losses["master"][-1] - losses["autocast"][-1]) / losses["autocast"][-1] < 0.05


def test_measure_config_as_a_pipeline_with_rounds(tokens, cpu_device):
    run, _ = T.measure_config("tiny", tiny(), tokens, device=cpu_device, min_time_s=0.04, monitor=False,
                              pipeline=True, rounds=3)
    m = run.run.measurement
    assert run.run.pipeline and len(m.windows) == 4 and len(m.round_medians) == 4
    est = run.tokens_per_s_estimate()
    assert est.lo <= est.value <= est.hi and run.tokens_per_s == est.value
    # Tokens over the windows' wall time: what the loop sustained, not tokens over the median step.
    calls, seconds = sum(n for n, _ in m.windows), sum(s for _, s in m.windows)
    assert est.value == pytest.approx(run.config.tokens_per_step * calls / seconds)
    row = run.row()
    assert row["pipeline"] is True and row["tokens_per_s_interval"] == [est.lo, est.hi]
    scaled = T.per_items(run.run, 2 * run.config.tokens_per_step)
    assert scaled.throughput == pytest.approx(run.run.throughput)  # the windows are rescaled with the times
    assert scaled.measurement.round_medians == pytest.approx([2 * t for t in m.round_medians])
    with pytest.raises(ValueError, match="rounds"):
        T.measure_config("tiny", tiny(), tokens, device=cpu_device, min_time_s=0.02, monitor=False, rounds=-1)


def test_config_run_mfu_against_one_peak(tokens, cpu_device):
    run, _ = T.measure_config("tiny", tiny(), tokens, device=cpu_device, min_time_s=0.02, monitor=False)
    assert run.mfu is None and run.mfu_estimate() is None  # no datasheet peak on a CPU
    run.peak_tflops_bf16 = 100.0
    run.run = T.with_peak(run.run, 25.0, peak_dtype=run.config.matmul_dtype)  # its "own dtype" peak
    est = run.mfu_estimate()
    assert est.value == pytest.approx(run.tokens_per_s * run.config.flops_per_token() / 100e12)
    assert run.mfu_vs_own_dtype == pytest.approx(4 * run.mfu_vs_bf16) and run.mfu == run.mfu_vs_bf16
    with pytest.warns(DeprecationWarning, match="mfu_vs_own_dtype"):
        assert run.mfu_own == run.mfu_vs_own_dtype
    assert T.with_peak(run.run, None).peak_tflops == 25.0


def test_one_peak_for_both_sides_is_named_in_the_mfu_row():
    """FP32 -> BF16 both against the BF16 peak (07's with_peak, 08's per_items): the row names that peak, not
    "each side's dtype"; a peak without its dtype is refused."""
    from gpulab.measuring.measurement import Measurement
    from gpulab.verdicts.run_result import RunResult

    def side(label, dtype, peak, seconds):
        return RunResult(label, Measurement(label, [seconds] * 5), flops=1e12, dtype=dtype, peak_tflops=peak,
                         items=1000, item_name="tokens")

    fp32, bf16 = side("fp32", "fp32", 67.0, 0.02), side("bf16", "bf16", 989.4, 0.004)
    for b, a in ((T.with_peak(fp32, 989.4, peak_dtype="bf16"), T.with_peak(bf16, 989.4, peak_dtype="bf16")),
                 (T.per_items(fp32, 2000, peak_tflops=989.4, peak_dtype="bf16"),
                  T.per_items(bf16, 2000, peak_tflops=989.4, peak_dtype="bf16"))):
        cmp = gl.Comparison("fp32 -> bf16", b, a)
        assert b.mfu == pytest.approx(b.tflops / 989.4) and a.peak_dtype is None  # bf16 is its own yardstick
        assert "MFU (datasheet BF16 peak, both sides)" in repr(cmp) and "each side" not in repr(cmp)
        assert gl.Comparison.from_dict(json.loads(json.dumps(cmp.to_dict()))).mfu_label() == cmp.mfu_label()
    assert "each side's dtype" in gl.Comparison("own peaks", fp32, bf16).mfu_label()
    assert T.with_peak(fp32, None, peak_dtype="bf16").peak_dtype is None  # no peak given: its own stays
    with pytest.raises(ValueError, match="peak_dtype"):
        T.with_peak(fp32, 989.4)
    with pytest.raises(ValueError, match="peak_dtype"):
        T.per_items(fp32, 2000, peak_tflops=989.4, peak_dtype="bf32")
    # A saved run from before peak_dtype was recorded: one number on both sides, named as a number.
    old = gl.Comparison("saved", side("fp32", "fp32", 989.4, 0.02), bf16)
    assert old.mfu_label() == "MFU (datasheet peak 989.4 TFLOP/s, both sides)"


def test_initial_weights_are_made_once_and_shared_read_only(tokens):
    cfg = tiny(seed=7)
    a = T.build_model(cfg)
    state = T.initial_state(cfg)
    assert T.initial_state(cfg.replace(attn="sdpa", fused_loss=True)) is state  # one model shape, one seed
    assert all(torch.equal(v, state[k]) for k, v in a.state_dict().items())
    b = T.build_model(cfg)  # from the remembered weights: the same model
    after = torch.rand(3)
    torch.manual_seed(cfg.seed)
    assert torch.equal(after, torch.rand(3))  # the RNG left seeded with cfg.seed, as when the weights were made
    assert all(torch.equal(v, state[k]) for k, v in b.state_dict().items())
    assert b.lm_head.weight is b.wte.weight and b.wte.weight.data_ptr() != state["wte.weight"].data_ptr()
    with T.Trainer(cfg, tokens) as tr:  # training changes the model's copy, never the shared weights
        w0 = state["blocks.0.mlp.0.weight"].clone()
        tr.step()
        assert not torch.equal(tr.model.blocks[0].mlp[0].weight.detach(), w0)
        assert torch.equal(state["blocks.0.mlp.0.weight"], w0) and tr._init_state is state
    padded = T.initial_state(cfg.replace(pad_vocab=True))
    assert padded["wte.weight"] is padded["lm_head.weight"]
    assert padded["blocks.0.mlp.0.weight"] is state["blocks.0.mlp.0.weight"]
