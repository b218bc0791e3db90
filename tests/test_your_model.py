"""Notebook 11 runs the whole toolkit on a model of the reader's: its smoke run records every tool's result."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from _notebook_jobs import edited
from gpulab.verdicts.params import SCHEMAS

NOTEBOOK = Path(__file__).resolve().parent.parent / "notebooks" / "11_your_model.ipynb"


def test_parameters_cell_leaves_every_size_to_the_schema():
    nb = json.loads(NOTEBOOK.read_text())
    assert nb["nbformat"] == 4 and nb["nbformat_minor"] == 5 and all(c.get("id") for c in nb["cells"])
    src = next("".join(c["source"]) for c in nb["cells"] if "parameters" in c["metadata"].get("tags", []))
    values: dict = {}
    exec(src, values)
    sized = [k for k, p in SCHEMAS["11_your_model"].items() if p.has_default]
    assert sized and all(values[k] is None for k in sized), "sized parameters start at None"
    assert values["SMOKE"] is False and set(values) - {"__builtins__"} <= set(SCHEMAS["11_your_model"])
    code = "\n".join("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code")
    assert 'gl.lesson("11_your_model", globals(), claims=' in code


def test_the_course_runs_it():
    from gpulab.app.course import notebooks

    assert NOTEBOOK in notebooks(["11"])


@pytest.mark.notebook
def test_smoke_run_records_every_tool(smoke_run):
    data, executed = smoke_run("11_your_model")
    assert data["smoke"] is True and data["params"]["BATCH"] == SCHEMAS["11_your_model"]["BATCH"].smoke
    extra = data["extra"]
    for key in ("diagnosis", "model", "step", "timeline", "tracker", "profile", "breakdown", "memory", "syncs", "batch_size",
                "dataloader", "failed", "seconds"):
        assert key in extra, key
    assert extra["model"]["class"] == "TinyLM" and extra["model"]["parameters"] > 0 and extra["failed"] == {}
    assert data["notebook"] == "11_your_model"  # no RUN_NAME: the course's own result file
    assert extra["step"]["flops"] > 0 and extra["step"]["median_ms"] > 0
    assert extra["tracker"]["steps"] > 0 and extra["batch_size"]["max_fitting"] >= 1
    assert extra["dataloader"]["rows"] and extra["memory"]["peak_bytes"] > 0
    assert extra["syncs"] is None  # no CUDA in CI: the sync hunt cannot tell, and says so
    names = [e["name"] for e in data["experiments"]]  # the diagnosis's measured fix, where one was faster, leads
    assert names[-1] == "my change" and all(n.startswith("diagnose: ") for n in names[:-1])
    diagnosis = extra["diagnosis"]
    assert diagnosis["kinds"] and diagnosis["evidence"]["gpu"] is False and diagnosis["needs_gpu"]
    assert [c["key"] for c in data["claims"]] == ["11.my_change"]
    errors = [o for c in executed["cells"] for o in c.get("outputs", []) if o["output_type"] == "error"]
    assert not errors
    md = [c for c in executed["cells"] if c["cell_type"] == "markdown"]
    assert "## Try this" in "".join(md[-1]["source"])


def test_run_name_is_checked_before_any_work():
    from gpulab.verdicts.params import check_params

    check_params({"RUN_NAME": "resnet18-bs32"}, "11_your_model")
    check_params({"RUN_NAME": None}, "11_your_model")
    for bad in ("../x", "", "a b", "x" * 41, 3):
        with pytest.raises(ValueError, match="RUN_NAME"):
            check_params({"RUN_NAME": bad}, "11_your_model")


# Two models the course does not ship, as a reader would paste them into the "Your model here" cell.
CNN_CELL = '''
class TinyResNet(nn.Module):
    """ResNet-like with BatchNorm everywhere; strided stages bring a 16-pixel image down to 1x1, as resnet18 does
    with a small image: BatchNorm then sees one value per channel at batch 1."""
    def __init__(self, width=8, classes=10):
        super().__init__()
        def stage(cin, cout):
            return nn.Sequential(nn.Conv2d(cin, cout, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU())
        self.features = nn.Sequential(stage(3, width), stage(width, width), stage(width, 2 * width), stage(2 * width, 2 * width))
        self.fc = nn.Linear(2 * width, classes)

    def forward(self, x):
        return self.fc(self.features(x).flatten(1))


torch.manual_seed(0)
model = TinyResNet().to(device)
make_batch = lambda b: (torch.randn(b, 3, 16, 16, device=device), torch.randint(10, (b,), device=device))
loss_fn = F.cross_entropy
'''

HF_CELL = '''
class ModelOutput(dict):
    """As Hugging Face's: a dict whose keys read as attributes (out.logits)."""
    __getattr__ = dict.__getitem__


class TinyGPT2LMHeadModel(nn.Module):
    """GPT2LMHeadModel's interface: forward(input_ids, attention_mask=None, labels=None) -> output.logits."""
    def __init__(self, vocab_size=128, n_embd=32, n_layer=1, n_head=2, n_positions=32):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab_size, n_embd), nn.Embedding(n_positions, n_embd)
        self.h = nn.ModuleList(nn.TransformerEncoderLayer(n_embd, n_head, 4 * n_embd, dropout=0.0, batch_first=True,
                                                          norm_first=True) for _ in range(n_layer))
        self.ln_f, self.lm_head = nn.LayerNorm(n_embd), nn.Linear(n_embd, vocab_size, bias=False)

    def forward(self, input_ids, attention_mask=None, labels=None):
        t = input_ids.shape[1]
        mask = nn.Transformer.generate_square_subsequent_mask(t, device=input_ids.device)
        h = self.wte(input_ids) + self.wpe(torch.arange(t, device=input_ids.device))
        for block in self.h:
            h = block(h, src_mask=mask, is_causal=True)
        return ModelOutput(logits=self.lm_head(self.ln_f(h)))


torch.manual_seed(0)
model = TinyGPT2LMHeadModel().to(device)
make_batch = lambda b: (torch.randint(128, (b, 32), device=device), torch.randint(128, (b, 32), device=device))
loss_fn = lambda out, y: F.cross_entropy(out.logits.flatten(0, 1), y.flatten())
'''


def _model_cell() -> str:
    nb = json.loads(NOTEBOOK.read_text())
    return next("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code" and "class SmallCNN" in
                "".join(c["source"]))


CNN_RUN = edited("11_your_model", [(_model_cell(), CNN_CELL)], {"RUN_NAME": "tinyresnet"},
                 result="11_your_model-tinyresnet")
# The reader also drops the finder's cap: on a CPU it refuses, says why, and sections 8, 9 and the save run.
DROP_CAP = ("gl.find_max_batch_size(step_at, max_batch=MAX_BATCH,", "gl.find_max_batch_size(step_at,")
HF_RUN = edited("11_your_model", [(_model_cell(), HF_CELL), DROP_CAP], {"RUN_NAME": "gpt2-style"},
                result="11_your_model-gpt2-style")


def _parameters(cell: str, cls: str) -> int:
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    ns = {"torch": torch, "nn": nn, "F": F, "device": torch.device("cpu")}
    exec(cell, ns)
    assert type(ns["model"]).__name__ == cls
    return sum(p.numel() for p in ns["model"].parameters())


def _no_errors(executed: dict) -> None:
    assert not [o for c in executed["cells"] for o in c.get("outputs", []) if o["output_type"] == "error"]


@pytest.mark.notebook
def test_a_batchnorm_cnn_runs_to_the_end_in_its_own_named_result():
    data, executed = CNN_RUN.result()
    _no_errors(executed)
    assert data["notebook"] == "11_your_model-tinyresnet"
    model = data["extra"]["model"]
    assert model["class"] == "TinyResNet" and model["parameters"] == _parameters(CNN_CELL, "TinyResNet")
    assert model["RUN_NAME"] == "tinyresnet" and model["MODEL"] == "lm"
    folder = next(CNN_RUN.results_folder().iterdir())
    assert (folder / "11_your_model-tinyresnet_trace.json.gz").is_file()
    assert (folder / "11_your_model-tinyresnet_tracker.csv").is_file()
    search = data["extra"]["batch_size"]  # BatchNorm cannot train at batch 1: skipped with the reason, then 2, 4, ...
    assert search["tried"][0]["batch_size"] == 1 and "BatchNorm" in search["tried"][0]["error"]
    assert search["max_fitting"] >= 2 and any("batch 1 skipped" in n for n in search["notes"])
    assert data["extra"]["failed"] == {} and data["extra"]["dataloader"]["rows"]
    assert [e["name"] for e in data["experiments"]][-1] == "my change" and data["extra"]["diagnosis"]["kinds"]
    assert [c["key"] for c in data["claims"]] == ["11.my_change"]  # a GPU claim: not tested here, and saved


@pytest.mark.notebook
def test_a_hugging_face_style_lm_runs_to_the_end_and_a_failing_tool_does_not_stop_it():
    """The reader also drops the finder's cap: on a CPU it refuses, says why, and sections 8, 9 and the save run."""
    data, executed = HF_RUN.result()
    _no_errors(executed)
    model = data["extra"]["model"]
    assert model["class"] == "TinyGPT2LMHeadModel"
    assert model["parameters"] == _parameters(HF_CELL, "TinyGPT2LMHeadModel")
    failed = data["extra"]["failed"]
    assert list(failed) == ["batch-size search"] and "max_batch" in failed["batch-size search"]
    assert "batch_size" not in data["extra"] and data["extra"]["dataloader"]["rows"]  # section 8 ran
    assert [e["name"] for e in data["experiments"]][-1] == "my change"  # section 9 ran
    assert [c["key"] for c in data["claims"]] == ["11.my_change"]
    assert data["experiments"][-1]["after"]["summary"]["item_name"] == "tokens"
    shown = json.dumps(executed)
    assert "batch-size search failed on this model" in shown and "max_batch is needed" in shown


def test_a_readers_model_gets_its_own_result_file_and_its_own_sizes():
    """Without RUN_NAME, only the notebook's own two models write 11_your_model.json; a reader's model writes
    11_your_model-<its class>.json, and the banner names its sizes, not the built-in models' defaults."""
    import torch

    from gpulab.lessons.your_model import model_sizes, result_stem

    TinyLM = type("TinyLM", (torch.nn.Linear,), {"__module__": "__main__"})  # as the notebook defines it
    Mine = type("ResNet18", (torch.nn.Linear,), {"__module__": "__main__"})
    params = dict(BATCH=4, WIDTH=32, DEPTH=1, SEQ_LEN=32, VOCAB=128, IMAGE_SIZE=16)
    assert result_stem(TinyLM(2, 2), None) == "11_your_model"
    assert result_stem(Mine(2, 2), None) == "11_your_model-ResNet18"
    assert result_stem(torch.nn.Linear(2, 2), None) == "11_your_model-Linear"
    assert result_stem(Mine(2, 2), "bs32") == result_stem(TinyLM(2, 2), "bs32") == "11_your_model-bs32"
    assert model_sizes(TinyLM(2, 2), 4, torch.zeros(4, 32), params) == dict(BATCH=4, WIDTH=32, DEPTH=1, SEQ_LEN=32,
                                                                            VOCAB=128)
    mine = model_sizes(Mine(3, 2), 8, torch.zeros(8, 3), params)
    assert mine == {"model": "ResNet18", "parameters": 8, "BATCH": 8, "inputs": (8, 3)}
    code = "\n".join("".join(c["source"]) for c in json.loads(NOTEBOOK.read_text())["cells"] if c["cell_type"] == "code")
    assert "result_stem(model, RUN_NAME)" in code and "model_sizes(model, BATCH, x" in code
    assert code.index("class SmallCNN") < code.index("result_stem(model, RUN_NAME)")


def test_the_diagnosis_is_the_first_result():
    nb = json.loads(NOTEBOOK.read_text())
    code = [("".join(c["source"])) for c in nb["cells"] if c["cell_type"] == "code"]
    first = next(i for i, src in enumerate(code) if "class SmallCNN" in src) + 1
    assert "diag = gl.diagnose(model, make_batch, loss_fn, batch_size=BATCH" in code[first]
    shown = [ln for src in code[:first] for ln in src.splitlines() if ln.startswith(("print(", "display("))]
    assert not shown  # nothing is shown before the diagnosis
