"""03_fusion in smoke mode: every claim of guide §3 is in the result, each with its evidence and interval."""
from __future__ import annotations

from pathlib import Path

import pytest

from gpulab.claims import EVIDENCE, VERDICTS
from gpulab.experiment import KINDS

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"
NAME = "03_fusion"
EXPERIMENTS = ["GELU: eager chain vs F.gelu", "GELU: eager vs torch.compile"]  # the ones smoke mode runs
CLAIMS = ["3 unfused elementwise ops = 6 memory operations, fused = 2: 3x fewer memory operations",
          "unfused x + bias, relu, * scale: 3 separate kernels", "fused by the compiler: 1 kernel",
          "kernel fusion: 2.8x speedup (2.5 ms -> 0.9 ms)", "kernel fusion: 0.9 ms after fusing (from 2.5 ms)",
          "GELU without compile: ~8 separate kernels", "GELU with compile: 1 fused kernel",
          "GELU with compile is 5-10x faster than without",
          "reduction fusion: (a * b).sum(dim=-1) in a single kernel",
          "horizontal fusion: two ops on one input in a single kernel",
          "torch.compile: 30-50% overhead reduction", "torch.compile modes: 30-100% speedup potential",
          "torch.compile: 15-25% speedup after the first, slow iteration", "torch.compile: 10-30% speedup",
          "reduce-overhead (CUDA graphs) beats default on launch-bound work",
          "max-autotune compiles slower than default", "max-autotune runs faster than default",
          "torch.compile (fused kernels, CUDA graphs): GPU utilization 92% -> 95%"]


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
             if "Guide §3 and the notes it draws on" in "".join(o.get("data", {}).get("text/html", ""))]
    try_this = [i for i, c in enumerate(cells) if c["cell_type"] == "markdown" and "## Try this" in "".join(c["source"])]
    assert table and try_this and table[0] < try_this[-1]


@pytest.mark.notebook
def test_byte_counts_are_arithmetic_and_kernel_counts_measured(run):
    data, _ = run
    by_text = {c["text"]: c for c in data["claims"]}
    assert by_text["3 unfused elementwise ops = 6 memory operations, fused = 2: 3x fewer memory operations"][
        "evidence"] == "arithmetic"
    assert by_text["GELU without compile: ~8 separate kernels"]["evidence"] == "measured"
