"""Notebook 10 through the course runner in smoke mode (2 gloo CPU processes): what its result JSON holds."""
from __future__ import annotations

import pytest

from gpulab.verdicts.results import load_result


@pytest.mark.notebook
def test_notebook_10_smoke_through_the_runner(tmp_path, monkeypatch):
    pytest.importorskip("papermill")
    from gpulab.app.course import run_course

    results = tmp_path / "results"
    monkeypatch.setenv("GPULAB_RESULTS", str(results))
    course = run_course(["10"], smoke=True, out=tmp_path / "runs", progress=False)
    assert course.ok, [r.error for r in course.runs]
    (path,) = results.glob("*/10_multi_gpu.json")
    data = load_result(path)
    assert data["smoke"] is True
    extra = data["extra"]
    assert extra["launch"]["safe_env"] == {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
                                           "NVSHMEM_DISABLE_NVLS": "1"}
    world = data["params"]["world"]
    assert world >= 2 and extra["allreduce"]["world"] == world
    rows = extra["allreduce"]["rows"]
    assert [r["bytes"] for r in rows] == sorted(r["bytes"] for r in rows) and rows[0]["bytes"] == 1024
    assert all(r["busbw_low"] <= r["busbw_gbs"] <= r["busbw_high"] for r in rows)
    labels = [r["label"] for r in extra["training"]["many"]]
    assert "FSDP2 (fully_shard per block)" in labels and len(labels) == 7
    assert all(r["tokens_per_s"] > 0 and r["world"] == world for r in extra["training"]["many"])
    assert extra["training"]["one"]["world"] == 1
    lo, hi = extra["scaling"]["interval"]
    assert lo <= extra["scaling"]["efficiency"] <= hi
    losses = extra["fsdp2_vs_ddp"]["loss"]
    assert losses[0] == pytest.approx(losses[1], rel=1e-3)  # DDP and FSDP2 train the same model the same way
    assert len(extra["overlap"]) == world
    names = [e["name"] for e in data["experiments"]]
    assert any(n.startswith("1 -> ") for n in names) and "DDP -> FSDP2 (same model, batch and data)" in names
    assert extra["scaling"]["plausible"] is False and extra["scaling"]["implausible_because"]  # CPU processes
    assert all(e["kind"] == "demonstration" for e in data["experiments"])  # never a gain
    claims = {c["key"]: c for c in data["claims"]}
    assert all(c.get("quote") for c in data["claims"])
    gb = claims["10.global_batch"]
    assert gb["verdict"] == "refuted" and gb["measured"] == 512
    for c in data["claims"]:
        assert c["verdict"] in {"confirmed", "refuted", "inconclusive", "not comparable", "not tested"}, c
        if c["verdict"] in ("not tested", "not comparable"):
            assert c["note"], c
