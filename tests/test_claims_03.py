"""03_fusion in smoke mode: every claim of guide §3 is in the result, each with its evidence and interval."""
from __future__ import annotations

from pathlib import Path

import pytest

from _notebook_run import check_claims_listed, check_experiments_listed, check_table_before_try_this

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
          "torch.compile fusion of opponent processing: 30-50% overhead reduction", "torch.compile modes: 30-100% speedup potential",
          "torch.compile: 15-25% speedup after the first, slow iteration", "torch.compile: 10-30% speedup",
          "reduce-overhead (CUDA graphs) beats default on launch-bound work",
          "max-autotune compiles slower than default", "max-autotune runs faster than default",
          "torch.compile (fused kernels, CUDA graphs): GPU utilization 92% -> 95%"]


@pytest.fixture(scope="module")
def run(smoke_run):
    return smoke_run(NAME)


@pytest.mark.notebook
def test_every_claim_has_evidence_and_an_interval_when_judged(run):
    check_claims_listed(run[0], CLAIMS)


@pytest.mark.notebook
def test_experiments_keep_their_names_and_say_their_kind(run):
    check_experiments_listed(run[0], EXPERIMENTS)


@pytest.mark.notebook
def test_the_claims_table_is_shown_before_try_this(run):
    check_table_before_try_this(run[1], "Guide §3 and the notes it draws on")


@pytest.mark.notebook
def test_byte_counts_are_arithmetic_and_kernel_counts_measured(run):
    data, _ = run
    by_text = {c["text"]: c for c in data["claims"]}
    assert by_text["3 unfused elementwise ops = 6 memory operations, fused = 2: 3x fewer memory operations"][
        "evidence"] == "arithmetic"
    assert by_text["GELU without compile: ~8 separate kernels"]["evidence"] == "measured"
