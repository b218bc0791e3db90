"""07 in smoke mode: its claims carry evidence and intervals, the new claims are there, the table is shown."""
import pytest

from _notebook_run import check_claims_contract, html_outputs

pytestmark = pytest.mark.notebook


@pytest.fixture(scope="module")
def run07(smoke_run):
    return smoke_run("07_mixed_precision")


def test_claims_contract(run07):
    data, _ = run07
    check_claims_contract(data)
    texts = [c["text"] for c in data["claims"]]
    for needle in ("Fused AdamW", "SDPA flash attention", "BF16 needs no loss scaling", "FP16 needs loss scaling",
                   "2.3 ms -> 1.1 ms", "over a TF32 baseline", "format table"):
        assert any(needle in t for t in texts), needle
    by = {c["text"]: c for c in data["claims"]}
    assert by["TF32 is enabled by default for FP32 matmuls (1 = on, 0 = off)"]["evidence"] == "definition"


def test_experiments_and_table(run07):
    data, executed = run07
    names = {e["name"] for e in data["experiments"]}
    assert {"matmul FP32 -> TF32", "AdamW step: foreach -> fused", "attention forward+backward: manual -> SDPA",
            "AdamW step: for-loop -> fused"} <= names
    html = html_outputs(executed)
    assert "Mixed precision (guide §7, 002, 003): every claim" in html
    assert "MFU vs dense BF16 peak (one yardstick)" in html
