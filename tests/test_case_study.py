"""The case study's claims on fake waterfall steps: what is judged, what is set aside, and with which interval."""
from dataclasses import dataclass, field

import pytest

from gpulab.lessons import case_study as CS
from gpulab import training as T
from gpulab.claims import Estimate, count_verdicts
from gpulab.monitor import Trace
from gpulab.workloads import GPTConfig


@dataclass
class FakeRun:
    trace: Trace | None = None


@dataclass
class FakeStep:
    """What case_study reads of a ConfigRun: config, tokens/s and MFU estimates, trace, peak memory."""

    config: T.TrainConfig
    tps: Estimate
    nvml: list[float] = field(default_factory=list)
    tensor: float | None = None
    peak_memory_gb: float | None = 10.0
    peak_bf16: float | None = 989.0

    def __post_init__(self):
        series = {"nvml_util": [(i * 0.2, v) for i, v in enumerate(self.nvml)]}
        window = {"gpm_tensor_active": self.tensor} if self.tensor is not None else {}
        self.run = FakeRun(Trace(duration_s=2.0, series=series, window=window) if self.nvml else None)

    def tokens_per_s_estimate(self):
        return self.tps

    def mfu_estimate(self):
        per = self.config.flops_per_token() / 1e12 / self.peak_bf16
        return self.tps.map(lambda r: r * per)


def waterfall(gains=(2.0, 1.13, 1.03, 2.2, 1.2, 1.0, 1.01, 1.5, 1.1, 1.07), spread=0.005):
    naive = T.TrainConfig(model=GPTConfig.gpt2_small(vocab_size=50257), batch_size=8)
    cfgs = T.waterfall_configs(naive, batch_size=32, grad_accum=2, num_workers=4, cudnn_attention=False,
                               fused_loss=False, bf16_weights=True)
    steps, rate = [], 40_000.0
    for i, (_, cfg) in enumerate(cfgs):
        if i:
            rate *= gains[i - 1]
        steps.append(FakeStep(cfg, Estimate(rate, rate * (1 - spread), rate * (1 + spread)),
                              nvml=[98, 98, 97, 100, 99] if i == 0 else [99, 98, 100, 99, 98], tensor=0.2 + i))
    return steps


def by_text(claims):
    return {c.text: c for c in claims}


def test_other_systems_are_never_confirmed_or_refuted():
    claims = CS.case_study_claims(waterfall(), gpu=True, device_memory_gb=80.0)
    others = [c for c in claims if any(c.text == o[0] for o in CS.OTHER_SYSTEMS)]
    assert len(others) == len(CS.OTHER_SYSTEMS)
    assert {c.verdict for c in others} <= {"not comparable", "not tested"}
    assert all(c.interval is not None for c in others if c.verdict == "not comparable")


def test_direction_lesson_and_floors_are_judged_on_intervals():
    steps = waterfall()
    c = by_text(CS.case_study_claims(steps, gpu=True, device_memory_gb=80.0))
    step1 = next(v for k, v in c.items() if k.startswith("Step 1"))
    assert step1.verdict == "confirmed" and step1.interval[0] > 1  # 1.13x with a 0.5% spread each side
    workers = next(v for k, v in c.items() if k.startswith("Step 2"))
    assert workers.verdict == "inconclusive"  # 1.01x: its interval reaches below 1
    compile_mag = next(v for k, v in c.items() if k.startswith("torch.compile's gain"))
    assert compile_mag.verdict == "confirmed" and compile_mag.measured == pytest.approx(7.0)
    lesson = next(v for k, v in c.items() if k.startswith("Utilization alone"))
    assert lesson.verdict == "confirmed" and lesson.interval[0] >= 90
    floor = next(v for k, v in c.items() if "10x faster" in k)
    ratio = steps[-1].tps.value / steps[0].tps.value
    assert floor.measured == pytest.approx(ratio) and floor.interval[0] < ratio < floor.interval[1]
    assert ratio > 10.5 and floor.verdict == "confirmed"
    datasheet = next(v for k, v in c.items() if k.startswith("A100 BF16"))
    assert datasheet.verdict == "confirmed" and datasheet.evidence == "datasheet"


def test_shared_measurements_count_once_per_claim():
    claims = CS.case_study_claims(waterfall(), gpu=True, device_memory_gb=80.0)
    ids = [c.measurement for c in claims if c.measurement]
    assert ids.count("speedup") >= 4  # the floor and four other systems' totals: one measurement
    counts = count_verdicts([c.to_dict() for c in claims])
    assert sum(counts.values()) == len(claims)  # every claim counts, with its own verdict


def test_without_a_gpu_nothing_is_judged_on_speed():
    claims = CS.case_study_claims(waterfall(), gpu=False, not_gpu="needs a GPU")
    judged = [c for c in claims if c.verdict in ("confirmed", "refuted", "inconclusive")]
    assert [c.evidence for c in judged] == ["datasheet"]


def test_estimate_helpers():
    a, b = Estimate(10, 9, 11), Estimate(2, 1.5, 2.5)
    assert CS.ratio(a, b).interval == pytest.approx((9 / 2.5, 11 / 1.5))
    assert CS.difference(a, b).interval == pytest.approx((6.5, 9.5))
    assert CS.ratio(None, b) is None and CS.difference(a, None) is None
    assert CS.trace_estimate(FakeRun(None), "nvml_util") is None
    est = CS.trace_estimate(FakeRun(Trace(series={"nvml_util": [(0, 90.0), (1, 100.0), (2, 95.0)]})), "nvml_util")
    assert est.value == pytest.approx(95.0) and est.lo <= 95 <= est.hi
    with pytest.raises(ValueError, match="proxy"):
        CS.Proxies(waterfall()).get("nonsense")


def test_claim_texts_are_unique():
    # NotebookResult.claim() keeps one claim per text: two claims with one text would lose one.
    claims = CS.case_study_claims(waterfall(), gpu=True, device_memory_gb=80.0)
    assert len({c.text for c in claims}) == len(claims)


def test_a_gain_under_the_minimum_refutes_speeds_up_even_when_it_is_above_one():
    """1.008x [1.004, 1.014]: real, but under the 2% a "speedup" needs; the same on every rerun, unlike > 1x."""
    from gpulab.claims import Claim, Estimate

    claim = Claim("step speeds the loop up", low=CS.MIN_GAIN, unit="x").check(Estimate(1.008, 1.004, 1.014))
    assert claim.verdict == "refuted" and claim.side == "lower"
