"""The scaffolding of notebooks 01 and 02: sizes, claims as data, and the small report functions, on the CPU."""
import pytest

import gpulab as gl
from gpulab.lessons import measuring_claims as mc
from gpulab.lessons import measuring_lesson as L
from gpulab.lessons import tensor_cores_lesson as T
from gpulab.claims import Estimate
from gpulab.lesson import _as_spec


def test_smoke_sizes_have_full_sizes_and_claims_are_valid_specs():
    for mod, claims in ((L, mc.CLAIMS), (T, T.CLAIMS)):
        assert set(mod.SMOKE) <= set(mod.FULL)
        specs = [_as_spec(c) for c in claims]
        assert len({s.key for s in specs}) == len(specs)
    keys = {c["key"] for c in mc.CLAIMS}
    assert set(mc.NOT_COMPARABLE) | set(mc.UNTESTABLE) <= keys
    assert set(T.UNTESTABLE) <= {c["key"] for c in T.CLAIMS}


def test_tiny_count_refuses_unequal_flops():
    assert L.tiny_count(64, 16) == 64
    with pytest.raises(ValueError, match="TINY_SIZE"):
        L.tiny_count(64, 24)


def test_evidence_without_a_reading_gives_the_reason():
    for value, why in (mc.window(None), mc.bursts(None, []), mc.memory_util(None, 64),
                       mc.target_util(None, None)):
        assert value is None and why.startswith("needs")
    assert mc.window(Estimate(1.0, 0.9, 1.1))[0].value == 1.0


def test_lesson_records_every_claim_on_cpu(cpu_device, tmp_path, monkeypatch):
    monkeypatch.setenv("GPULAB_RESULTS", str(tmp_path))
    les = gl.lesson("02_tensor_cores", {"SMOKE": True}, full=T.FULL, smoke=T.SMOKE, claims=T.CLAIMS,
                    device=cpu_device, show=False)
    T.declare_square_claim(les, 128, 127)
    T.record_the_rest(les)
    les.save()
    texts = {c.text: c.verdict for c in les.result.claims}
    assert texts["Matmul dimensions should be multiples of 8 for tensor cores (128 vs 127) (aligned ÷ misaligned "
                 "TFLOP/s)"] == "not tested"
    assert sum(v == "not comparable" for v in texts.values()) == 4


def test_bad_neighbours_are_the_guides():
    assert T.bad_neighbours(4096, 32, 1024, 768) == dict(n=4095, batch=33, hidden=770, seq=1000)


def test_host_clock_and_flop_counts_on_cpu():
    m = L.host_clock(lambda: None, sync_after=True, reps=3)
    assert m.median >= 0 and m.label == "host clock"
    import torch

    from gpulab.workloads import GPT, GPTConfig
    cfg = GPTConfig(vocab_size=64, n_layer=1, n_head=2, n_embd=16, block_size=8)
    model = GPT(cfg)
    x = torch.randint(0, 64, (2, 8))
    counts = L.flop_counts(cfg, 2, model.num_params(), lambda: model(x), lambda: model(x, x)[1].backward())
    assert set(counts) == {"guide §1.2 formula", "6N + 12·L·H·Q·T", "FlopCounterMode"}
    assert all(t > f > 0 for f, t in counts.values())
