"""04_sync_points in smoke mode: every claim of guide §4 is in the result, each with its evidence and interval."""
from __future__ import annotations

from pathlib import Path

import pytest

from gpulab.claims import EVIDENCE, VERDICTS
from gpulab.experiment import KINDS

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"
NAME = "04_sync_points"
EXPERIMENTS = ["training loop: two .item() per step vs one",
               "training loop: .item() every step vs losses summed on the GPU",
               "masked loss: boolean indexing vs torch.where",
               "eval loop: .cpu() every batch vs one transfer at the end", "zero_grad: set_to_none=False vs True"]
CLAIMS = [".item() forces a CPU-GPU sync", ".cpu() forces a CPU-GPU sync",
          "dynamic control flow (`if tensor.sum() > 0:`) forces a CPU-GPU sync",
          "boolean-mask indexing forces a CPU-GPU sync",
          "accumulate on the GPU, log every N steps: one sync per N steps",
          "non_blocking needs pinned memory: from pageable memory the call returns only after the copy",
          "a single .item() per step instead of two: 2-5% faster",
          "eliminating the CPU-GPU sync in the training loop: 15-20% faster iterations",
          "`.numpy()` forces a CPU-GPU sync",
          "`int(tensor.max())` for a dynamic size forces a CPU-GPU sync"]


@pytest.fixture(scope="module")
def run(smoke_run):
    return smoke_run(NAME)


@pytest.mark.notebook
def test_every_claim_has_evidence_and_an_interval_when_judged(run):
    data, _ = run
    texts = [c["text"] for c in data["claims"]]
    for t in CLAIMS:
        assert t in texts, t
    for c in data["claims"]:
        assert c["verdict"] in VERDICTS and c["evidence"] in EVIDENCE, c
        if c["verdict"] in ("confirmed", "refuted", "inconclusive") and c["evidence"] == "measured":
            assert c["interval"] is not None and c["interval"][0] <= c["measured"] <= c["interval"][1], c
        if c["verdict"] in ("not tested", "not comparable"):
            assert c["note"], c


@pytest.mark.notebook
def test_experiments_keep_their_names_and_say_their_kind(run):
    data, _ = run
    names = [e["name"] for e in data["experiments"]]
    for n in EXPERIMENTS:
        assert n in names, n
    assert all(e["kind"] in KINDS for e in data["experiments"])


@pytest.mark.notebook
def test_the_claims_table_is_shown_before_try_this(run):
    _, nb = run
    cells = nb["cells"]
    table = [i for i, c in enumerate(cells) for o in c.get("outputs", [])
             if "Guide §4 and the fixes it cites" in "".join(o.get("data", {}).get("text/html", ""))]
    try_this = [i for i, c in enumerate(cells) if c["cell_type"] == "markdown" and "## Try this" in "".join(c["source"])]
    assert table and try_this and table[0] < try_this[-1]
