"""Notebook 08's lesson module: the reference match, the claims as data, and their verdicts on fake waterfall steps."""
from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from gpulab.workloads import training as T
from gpulab.measuring.estimates import Estimate
from gpulab.verdicts.lesson import Lesson, _as_spec
from gpulab.lessons import case_study as CS
from gpulab.measuring.monitor import Trace
from gpulab.verdicts.results import NotebookResult
from gpulab.workloads.models import GPTConfig


# The full-size run's params as gl.lesson records them (upper case) and an older reference's (lower case).
OURS = dict(N_LAYER=12, N_HEAD=12, N_EMBD=1536, SEQ_LEN=1024, VOCAB_SIZE=50257, NAIVE_BATCH=8, BATCH_SIZE=32,
            GRAD_ACCUM=2, WORKERS=4, STEP_SECONDS=2.0, fused_loss=True, bf16_weights=True, compile=True)


def reference(**changes):
    params = {k.lower(): v for k, v in OURS.items()} | changes
    return {"smoke": False, "params": params, "extra": {"waterfall": []}}


def test_same_shape_compares_the_whole_model_not_only_its_depth():
    assert CS.same_shape(reference(), OURS)
    wider = reference(n_embd=768)  # differs only in width: the reference ran another model (540k vs 203k tok/s)
    assert wider["params"]["n_layer"] == OURS["N_LAYER"]  # the depth-only test on main took this for a match
    assert not CS.same_shape(wider, OURS)
    for key, other in [("n_head", 24), ("seq_len", 512), ("vocab_size", 50304), ("batch_size", 16),
                       ("grad_accum", 4), ("naive_batch", 4), ("workers", 0), ("compile", False)]:
        assert not CS.same_shape(reference(**{key: other}), OURS), key


def test_same_shape_needs_a_full_size_reference_with_every_key():
    assert not CS.same_shape(None, OURS)
    assert not CS.same_shape(reference() | {"smoke": True}, OURS)
    partial = reference()
    del partial["params"]["n_embd"]
    assert not CS.same_shape(partial, OURS)
    assert CS.same_shape(reference(step_seconds=5.0), OURS)  # timing, not shape


def test_claims_are_keyed_quoted_and_sourced():
    keys = [c["key"] for c in CS.CLAIMS]
    assert len(keys) == len(set(keys))
    assert all(c["quote"] and c["source"] for c in CS.CLAIMS)
    assert set(CS.PROXY) | {c["key"] for c in CS.JUDGED} == set(keys)


def test_one_reason_per_other_system_and_one_verdict_per_sentence():
    reasons = {why for _, why in CS.PROXY.values()}
    assert reasons == {CS.VLM, CS.SCORER, CS.RTX}
    compile_quotes = [c for c in CS.CLAIMS if "15-25% speedup" in c["quote"]]
    assert [c["key"] for c in compile_quotes] == ["compile_speedup"] and "compile_speedup" in CS.PROXY
    judged_quotes = [c["quote"] for c in CS.JUDGED if c["source"].startswith("guide")]
    other_quotes = {c["quote"] for c in CS.CLAIMS if c["key"] in CS.PROXY}
    assert not set(judged_quotes) & other_quotes


@dataclass
class FakeRun:
    trace: Trace | None = None


@dataclass
class FakeStep:
    """What case_study reads of a ConfigRun: config, tokens/s and MFU estimates, trace, peak memory."""

    config: T.TrainConfig
    tps: Estimate
    nvml: list[float] = field(default_factory=list)
    peak_memory_gb: float | None = 10.0

    def __post_init__(self):
        self.tokens_per_s = self.tps.value
        self.run = FakeRun(Trace(duration_s=2.0, series={"nvml_util": [(i * 0.2, v) for i, v in enumerate(self.nvml)]}))

    def tokens_per_s_estimate(self):
        return self.tps

    def mfu_estimate(self):
        per = self.config.flops_per_token() / 1e12 / 989.0
        return self.tps.map(lambda r: r * per)

    def row(self):
        return {"tokens_per_s": self.tokens_per_s}


def waterfall(gains=(2.0, 1.13, 1.03, 2.2, 1.2, 1.0, 1.01, 1.5, 1.1, 1.07), spread=0.005):
    naive = T.TrainConfig(model=GPTConfig.gpt2_small(vocab_size=50257), batch_size=8)
    cfgs = T.waterfall_configs(naive, batch_size=32, grad_accum=2, num_workers=4, cudnn_attention=False,
                               fused_loss=False, bf16_weights=True, compile=True)
    steps, rate = [], 40_000.0
    for i, (_, cfg) in enumerate(cfgs):
        rate *= gains[i - 1] if i else 1.0
        steps.append(FakeStep(cfg, Estimate(rate, rate * (1 - spread), rate * (1 + spread)),
                              nvml=[98, 98, 97, 100, 99] if i == 0 else [99, 98, 100, 99, 98]))
    return steps


class FakeDevice:
    is_cuda = True
    name = "fake GPU"


def judged(steps, gpu=True):
    dev = FakeDevice()
    dev.is_cuda = gpu
    lesson = Lesson("08_case_study", dev, False, {}, NotebookResult.__new__(NotebookResult), None,
                    {c["key"]: _as_spec(c) for c in CS.CLAIMS})
    lesson.result.claims = []
    lesson.result.claim = lambda c: (lesson.result.claims.append(c), c)[1]
    lesson.missing = lambda *needs: None if gpu else "needs a CUDA GPU"
    CS.judge_waterfall(lesson, steps, device_memory_gb=80.0)
    return {c.key.split(".", 1)[1]: c for c in lesson.result.claims}


def test_waterfall_claims_on_fake_steps():
    steps = waterfall()
    rows = CS.waterfall_rows(steps)
    assert rows[0]["gain"] is None and rows[1]["gain"] == pytest.approx(2.0)
    c = judged(steps)
    assert c["floor_speedup"].verdict == "confirmed"  # 2.0 * 1.13 * ... > 10x
    assert c["naive_util_target"].verdict == "confirmed" and c["util_flat"].verdict == "confirmed"
    assert c["a100_peak"].verdict == "confirmed"
    for key in CS.PROXY:
        assert c[key].verdict == "not comparable", key
    assert c["compile_speedup"].measured == pytest.approx(c["step4_compile"].measured)  # our compile gain beside


def test_data_step_is_not_judged_on_a_loop_whose_data_sits_in_memory():
    """More workers could not come out faster on this loop, whatever the gain: the step is not tested, and says why."""
    for gains in ((2.0, 1.13, 1.5, 2.2, 1.2, 1.0, 1.01, 1.5, 1.1, 1.07), (2.0, 1.13, 0.9, 2.2, 1.2, 1.0, 1.01, 1.5, 1.1, 1.07)):
        c = judged(waterfall(gains))["step2_data"]
        assert c.verdict == "not tested" and "sits in memory" in c.note + str(getattr(c, "reason", ""))


def test_waterfall_claims_without_a_gpu_are_not_tested():
    c = judged(waterfall(), gpu=False)
    assert all(c[k].verdict == "not tested" for k in CS.JUDGED_PROXY)
    assert all(c[k].verdict == "not comparable" for k in CS.PROXY)


def test_loss_gap_estimate_is_signed_with_the_paired_gaps_as_interval():
    ref = [10.0, 8.0, 6.0, 5.0, 4.0, 4.0, 4.0, 4.0, 4.0, 4.0]
    run = [r * 1.01 for r in ref]
    gap = T.loss_gap_estimate(run, ref)
    assert gap.value == pytest.approx(1.0) and gap.lo <= gap.value <= gap.hi
    assert T.loss_gap_estimate(ref, run).value < 0
    with pytest.raises(ValueError):
        T.loss_gap_estimate(run[:-1], ref)


def test_waterfall_rounds_follow_what_the_verdicts_read():
    """A judged gain reads its step and the one before; the naive and the last step feed the floors: every round
    for the gain near its bar (compile), two for the other steps a verdict reads (their bars are cleared by 10% or
    more), one elsewhere (two windows, so the table's interval is still a range)."""
    naive = T.TrainConfig(model=GPTConfig.gpt2_small(vocab_size=50257), batch_size=8)
    for compile_ in (True, False):
        cfgs = T.waterfall_configs(naive, batch_size=32, grad_accum=2, num_workers=4, compile=compile_)
        rounds = dict(zip([label for label, _ in cfgs], CS.waterfall_rounds(cfgs, 8)))
        steps = [FakeStep(cfg, Estimate.exact(1.0)) for _, cfg in cfgs]
        read, near = {0, len(cfgs) - 1}, set()
        for key, field_name in CS.STEP_FIELDS.items():
            s, p = CS.step_with(steps, field_name)
            if key not in CS.NOT_JUDGED_HERE and s is not None:
                read |= {steps.index(s), steps.index(p)}
                near |= {steps.index(s), steps.index(p)} if field_name in CS.NEAR_BAR else set()
        for i, (label, _) in enumerate(cfgs):
            assert rounds[label] == (8 if i in near else 2 if i in read else 1), label
        assert rounds["+ DataLoader workers, pinned"] == 1 and rounds["naive FP32"] == 2
    assert rounds["+ BF16 weights, FP32 master"] == 2  # no compile step: the last step's floors are far from their bars
    assert CS.waterfall_rounds(cfgs, 1) == [1] * len(cfgs)  # never more than asked
    assert CS.waterfall_rounds(cfgs, 0) == [0] * len(cfgs)
    assert sorted(set(CS.waterfall_rounds(cfgs, 3))) == [1, 2]  # no compile step here: read steps 2, the others 1
