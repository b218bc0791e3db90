"""gpulab.tools.distributed on CPU: torchrun with gloo on 2 processes, a failing rank, a timeout, the safe environment."""
from __future__ import annotations

import os
import subprocess
import types

import pytest

from gpulab.tools import distributed as D


def test_safe_env_always_set_even_against_the_callers_values():
    base = {"PATH": os.environ.get("PATH", ""), "NCCL_NVLS_ENABLE": "1", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "0",
            "NVSHMEM_DISABLE_NVLS": "0"}
    env = D.launch_env(base, nproc=2, backend="nccl")
    assert env["NCCL_NVLS_ENABLE"] == "0"
    assert env["TORCH_SYMM_MEM_DISABLE_MULTICAST"] == "1"
    assert env["NVSHMEM_DISABLE_NVLS"] == "1"
    assert env["PYTHONPATH"].split(os.pathsep)[0] == str(D.PACKAGE_ROOT)


def test_launch_passes_the_safe_env_to_torchrun(monkeypatch):
    seen = {}

    class FakePopen:
        def __init__(self, cmd, env, **kw):
            seen["cmd"], seen["env"] = cmd, env
            self.pid, self.returncode = 0, 0

        def communicate(self, timeout=None):
            return "", None

    # only gpulab.tools.distributed's Popen: the notebook jobs beside the tests start real processes meanwhile
    fake = types.SimpleNamespace(Popen=FakePopen, **{k: getattr(subprocess, k) for k in ("PIPE", "STDOUT", "TimeoutExpired")})
    monkeypatch.setattr(D, "subprocess", fake)
    monkeypatch.setenv("NCCL_NVLS_ENABLE", "1")
    run = D.launch("gpulab.tools.distributed:hello", nproc=2, backend="gloo", check=False)
    assert {k: seen["env"][k] for k in D.SAFE_ENV} == D.SAFE_ENV
    assert run.safe_env == D.SAFE_ENV
    assert seen["cmd"][1:4] == ["-m", "torch.distributed.run", "--standalone"]
    assert "--nproc-per-node" in seen["cmd"] and "gpulab._rank" in seen["cmd"]


@pytest.mark.parametrize("nproc,backend,cuda,match", [
    (0, "gloo", 0, "nproc=0"), (2, "mpi", 0, "backend='mpi'"), (True, "gloo", 0, "nproc=True"),
    (2, "nccl", 1, "needs 2 CUDA GPUs"), (3, "nccl", 2, "but 2 are visible")])
def test_check_launch_rejects_bad_arguments(nproc, backend, cuda, match):
    with pytest.raises(ValueError, match=match):
        D.check_launch(nproc, backend, cuda_count=cuda)


def test_choose_backend_picks_nccl_on_every_gpu_only_with_two_or_more():
    assert D.choose_backend("auto", cuda_count=0) == ("gloo", 2)
    assert D.choose_backend("auto", cuda_count=1) == ("gloo", 2)
    assert D.choose_backend("auto", cuda_count=2) == ("nccl", 2)
    assert D.choose_backend("auto", cuda_count=8) == ("nccl", 8)
    assert D.choose_backend("gloo", 3, cuda_count=8) == ("gloo", 3)


def test_bad_target_and_timeouts_fail_before_launching():
    with pytest.raises(ValueError, match="target="):
        D.launch("gpulab.tools.distributed.hello", nproc=1, backend="gloo")
    with pytest.raises(ValueError, match="target="):
        D.launch("gpulab.tools.distributed:no_such_function", nproc=1, backend="gloo")
    with pytest.raises(ValueError, match="timeout_s"):
        D.launch("gpulab.tools.distributed:hello", nproc=1, backend="gloo", timeout_s=0)


def test_two_gloo_ranks_all_reduce_and_report_back():
    run = D.launch("gpulab.tools.distributed:hello", nproc=2, backend="gloo", timeout_s=120)
    assert run.ok and [r["rank"] for r in run.results] == [0, 1]
    assert all(r["sum"] == 3.0 and r["world_size"] == 2 for r in run.results)
    assert all(r["env"] == D.SAFE_ENV for r in run.results)  # what the ranks themselves saw
    assert run.traces[0] is not None  # the monitor ran on each rank (and said why it has no GPU series)


def test_a_failing_rank_reports_its_rank_and_traceback():
    run = D.launch("gpulab.tools.distributed:hello", nproc=2, backend="gloo", kwargs={"fail_rank": 1}, timeout_s=120,
                   check=False)
    assert not run.ok
    failed = {r.rank: r for r in run.failures}
    assert 1 in failed and "rank 1 failed on purpose" in failed[1].error
    assert "Traceback" in failed[1].traceback and "hello" in failed[1].traceback
    with pytest.raises(D.DistributedError, match="rank 1: RuntimeError"):
        run.raise_for_failures()


def test_a_launch_past_its_timeout_is_stopped_not_hung():
    # The ranks would sleep 120 s: a launch that returns, timed out, with each rank's error saying so, stopped
    # them (no wall-clock bound here: a loaded host stretches the start-up, not the verdict).
    run = D.launch("gpulab.tools.distributed:hello", nproc=2, backend="gloo", kwargs={"sleep_s": 120}, timeout_s=10,
                   check=False)
    assert run.timed_out and not run.ok
    assert all("timeout" in r.error for r in run.ranks)
    for r in run.ranks:  # no rank left behind
        assert r.result is None


def test_a_native_gloo_abort_is_told_apart_from_a_python_error():
    """A rank killed by SIGABRT in C++ (no Python error) is launched once more; a rank's own exception is not."""
    from gpulab.tools.distributed import DistributedRun, RankOutcome, native_abort

    died = RankOutcome(0, False, error="no result: the rank was stopped (another rank failed, or it crashed before "
                                        "reporting)")
    run = DistributedRun("m:f", 2, "gloo", [], 1, False, 1.0, [died, died], "exitcode  : -6 (SIGABRT)")
    assert native_abort(run)
    raised = RankOutcome(1, False, error="RuntimeError: rank 1 failed on purpose")
    assert not native_abort(DistributedRun("m:f", 2, "gloo", [], 1, False, 1.0, [died, raised], "SIGABRT"))
    assert not native_abort(DistributedRun("m:f", 2, "gloo", [], 1, True, 1.0, [died, died], "SIGABRT"))
