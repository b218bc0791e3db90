"""A waterfall stage's change as the PyTorch it amounts to, derived from the two configurations."""
import dataclasses

import pytest

from gpulab.lessons.case_study import stages_code_html
from gpulab.workloads.training import TrainConfig, waterfall_configs
from gpulab.workloads.training.as_code import _AS_CODE, change_as_code
from gpulab.workloads.models import GPTConfig

SMALL = GPTConfig(vocab_size=257, n_layer=1, n_head=2, n_embd=32, block_size=32)
CHANGES = {"model": SMALL.__class__(vocab_size=300, n_layer=1, n_head=2, n_embd=32, block_size=32),
           "batch_size": 16, "grad_accum": 4, "seq_len": 16, "tf32": True, "autocast": "bf16",
           "grad_scaler": True, "param_dtype": "bf16", "master_weights": True, "fused_adamw": True, "attn": "sdpa",
           "sync_every_step": False, "num_workers": 3, "pin_memory": True, "compile": True,
           "compile_mode": "max-autotune", "pad_vocab": True, "fused_loss": True, "lr": 1e-3, "warmup_steps": 2,
           "weight_decay": 0.0, "grad_clip": None, "loss_multiplier": 2.0, "seed": 1, "data_seed": 1}


def test_every_field_has_a_change_to_show():
    assert {f.name for f in dataclasses.fields(TrainConfig)} == set(CHANGES)
    assert set(_AS_CODE) <= set(CHANGES)


@pytest.mark.parametrize("field", sorted(CHANGES))
def test_one_changed_field_is_one_line_naming_its_new_value(field):
    base = TrainConfig(model=SMALL)
    if field == "master_weights":
        base = base.replace(param_dtype="bf16")
    if field == "compile_mode":
        base = base.replace(compile=True)
    if field == "grad_scaler":
        base = base.replace(autocast="fp16")
    after = base.replace(**{field: CHANGES[field]})
    lines = change_as_code(base, after)
    assert len(lines) == 1, lines
    assert change_as_code(after, after) == []


def test_lines_say_what_ran():
    base = TrainConfig(model=SMALL)
    assert change_as_code(base, base.replace(autocast="bf16")) == [
        'with torch.autocast(device_type="cuda", dtype=torch.bfloat16): loss = model(x, y)']
    assert change_as_code(base, base.replace(compile=True, compile_mode="reduce-overhead")) == [
        'model = torch.compile(model, mode="reduce-overhead")']
    assert change_as_code(base, base.replace(compile_mode="max-autotune")) == []  # no compile, no mode
    assert "fused=True" in change_as_code(base, base.replace(fused_adamw=True))[0]
    assert "vocab_size=320" in change_as_code(base, base.replace(pad_vocab=True))[0]


def test_a_readers_edit_of_the_workers_shows_in_the_stages_code():
    naive = TrainConfig(model=SMALL)
    stages = waterfall_configs(naive, batch_size=8, grad_accum=2, num_workers=8, compile=True)
    code = {label: change_as_code(prev, cfg) for (_, prev), (label, cfg) in zip(stages, stages[1:])}
    assert all(code.values()), code  # every stage changes something a reader can see
    workers = next(v for k, v in code.items() if "workers" in k)
    assert any("num_workers=8" in line for line in workers) and any("pin_memory=True" in line for line in workers)
    html = stages_code_html([{"label": "naive FP32", "code": []}] + [{"label": k, "code": v} for k, v in code.items()])
    assert "num_workers=8" in html and "<code>" in html and "the loop of section 3, as written" in html
