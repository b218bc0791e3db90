"""gl.diagnose: each rule names each lesson's "before" loop from recorded evidence, a healthy loop gets no invented
problem, the diagnosis is JSON-ready, and a run leaves the model, the optimizer and torch's settings as they were."""
from __future__ import annotations

import json

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import gpulab as gl
from gpulab.tools.diagnosis import classify, rules
from gpulab.tools.diagnosis.report import Diagnosis, Finding, rank


def healthy_gpu(**over):
    """Recorded evidence of a well-fed, tensor-core-bound step on a GPU (08's optimized loop, roughly)."""
    ev = {"gpu": True, "device": "cuda:0", "batch_size": 256, "step_ms": 40.0, "profiled_step_ms": 42.0,
          "busy": 0.95, "idle": {"host_launching": 0.03, "after_sync": 0.0, "queued": 0.01},
          "classes": {"matmul_tc": 0.62, "elementwise": 0.12, "attention_fused": 0.1, "optimizer": 0.03,
                      "other": 0.08},
          "kernels_per_step": 300.0, "syncs_per_step": 0.0, "sync_calls": [], "memory_headroom": 0.4,
          "conv": False, "channels_last": False,
          "optimizer": {"class": "AdamW", "fused": True, "foreach": False, "tensors": 150, "share": 0.03},
          "loader_wait_share": 0.0, "loader_wait_ms": 0.01, "mfu": 0.45}
    for k, v in over.items():
        ev[k] = {**ev[k], **v} if isinstance(v, dict) and isinstance(ev.get(k), dict) else v
    return ev


BEFORE_CASES = {  # each lesson's "before" loop, as an H200 profile would record it
    "fp32_matmul": healthy_gpu(classes={"matmul_tc": 0.0, "matmul_fp32": 0.7}, mfu=0.04),
    "sync": healthy_gpu(syncs_per_step=1.0, sync_calls=["called a synchronizing CUDA operation"],
                        idle={"after_sync": 0.18}, busy=0.77),
    "data_wait": healthy_gpu(loader_wait_share=0.72, loader_wait_ms=30.0, busy=0.25,  # the GPU idles meanwhile
                             idle={"host_launching": 0.7}, batch_size=32),
    "small_batch": healthy_gpu(batch_size=8, busy=0.5, idle={"host_launching": 0.19, "queued": 0.12},
                               memory_headroom=0.97),
    "attention": healthy_gpu(classes={"attention_fused": 0.0, "softmax": 0.14, "matmul_tc": 0.5}),
    "optimizer": healthy_gpu(optimizer={"fused": False, "foreach": False, "share": 0.35}),
    "layout": healthy_gpu(conv=True, classes={"layout": 0.09, "matmul_tc": 0.55}, mfu=0.3),
    "elementwise": healthy_gpu(classes={"elementwise": 0.45, "matmul_tc": 0.3}),
    "launch_bound": healthy_gpu(busy=0.4, idle={"host_launching": 0.55}, kernels_per_step=2000.0),
}


@pytest.mark.parametrize("kind", sorted(BEFORE_CASES))
def test_each_lessons_before_loop_is_named_first(kind):
    found, needs_gpu = rules.findings(BEFORE_CASES[kind])
    assert found[0].kind == kind and needs_gpu == []
    assert 0 < found[0].share <= 1 and found[0].fix and found[0].notebook


def test_a_healthy_loop_gets_no_invented_problem():
    found, _ = rules.findings(healthy_gpu())
    assert [f.kind for f in found] == ["healthy"]
    assert "MFU 45%" in found[0].title and "matmul_tc" in found[0].title and not found[0].fix


@pytest.mark.parametrize("rule,key,below,at", [
    (rules.launch_bound, "idle", {"host_launching": rules.LAUNCH_IDLE - 0.01}, {"host_launching": rules.LAUNCH_IDLE}),
    (rules.fp32_matmul, "classes", {"matmul_fp32": rules.FP32_MATMUL - 0.01}, {"matmul_fp32": rules.FP32_MATMUL}),
    (rules.elementwise, "classes", {"elementwise": rules.ELEMENTWISE - 0.01}, {"elementwise": rules.ELEMENTWISE}),
    (rules.layout, "classes", {"layout": rules.LAYOUT - 0.01}, {"layout": rules.LAYOUT}),
])
def test_thresholds_are_where_they_are_stated(rule, key, below, at):
    assert rule(healthy_gpu(**{key: below})) is None and rule(healthy_gpu(**{key: at})) is not None


def test_rules_that_need_their_conditions():
    # channels_last already: the conversions are not a layout problem the fix can remove
    assert rules.layout(healthy_gpu(classes={"layout": 0.2}, channels_last=True)) is None
    # a fused attention kernel in the step: softmax kernels are something else
    assert rules.attention(healthy_gpu(classes={"softmax": 0.2, "attention_fused": 0.1})) is None
    # a large batch with idle time is launch-bound, not small; a full GPU has no room for a larger one
    assert rules.small_batch(BEFORE_CASES["small_batch"] | {"batch_size": 512}) is None
    assert rules.small_batch(BEFORE_CASES["small_batch"] | {"memory_headroom": 0.1}) is None
    # a GPU idle while the host waits for data is starved, not launch-bound
    assert rules.launch_bound(BEFORE_CASES["data_wait"]) is None and rules.small_batch(BEFORE_CASES["data_wait"]) is None
    # a sync with no idle after it costs nothing measurable
    assert rules.sync(healthy_gpu(syncs_per_step=2.0)) is None


def test_a_cpu_run_says_what_it_cannot_tell():
    ev = healthy_gpu(gpu=False, busy=None, idle=None, syncs_per_step=None, memory_headroom=None,
                     classes={"matmul": 0.8}, loader_wait_share=0.4)
    found, needs_gpu = rules.findings(ev)
    assert [f.kind for f in found] == ["data_wait"]
    assert set(needs_gpu) == {"launch_bound", "sync", "small_batch", "fp32_matmul", "layout", "elementwise"}
    assert "syncs mean nothing" in rules.CPU_NOTES[0]


def test_kernel_names_fall_in_their_classes():
    k = classify.kernel_class
    assert k("ampere_sgemm_128x64_nn") == "matmul_fp32"
    assert k("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64") == "matmul_tc"
    assert k("cutlass_80_tensorop_s1688gemm_tf32_128x128") == "matmul_tc"
    assert k("void cudnn::engines_precompiled::nchwToNhwcKernel<float>") == "layout"
    assert k("void at::native::(anonymous)::cunn_SoftMaxForward<4, float>") == "softmax"
    assert k("void at::native::cunn_SoftMaxForward<4, float, float, float, at::native::LogSoftMaxForwardEpilogue>") \
        == "other"  # cross-entropy, not attention
    assert k("void (anonymous namespace)::softmax_warp_forward<float, float, float, 4, true, false>(float*)") == "other"
    assert k("void (anonymous namespace)::softmax_warp_forward<c10::BFloat16, c10::BFloat16, float, 10, false, "
             "false>(c10::BFloat16*)") == "softmax"
    assert k("void at::native::unrolled_elementwise_kernel<convert_fn>") == "elementwise"
    assert k("cudnn_convert_tensor_kernel") == "other"
    assert k("pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits>") == "attention_fused"
    assert k("void at::native::vectorized_elementwise_kernel<4, at::native::GeluCUDAKernelImpl>") == "elementwise"
    assert k("void at::native::multi_tensor_apply_kernel<FusedAdamMathFunctor>") == "optimizer"


def test_classes_from_a_recorded_gpu_trace():
    """Two steps: a GEMM, an elementwise kernel, and a per-tensor optimizer kernel launched inside Optimizer.step."""
    ev = []
    for s in (0, 1000):
        ev += [{"ph": "X", "cat": "user_annotation", "name": "gpulab_step", "ts": s, "dur": 800},
               {"ph": "X", "cat": "user_annotation", "name": "Optimizer.step#AdamW.step", "ts": s + 600, "dur": 150},
               {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": s + 650, "dur": 5,
                "args": {"correlation": s + 3}},
               {"ph": "X", "cat": "kernel", "name": "ampere_sgemm_64x64", "ts": s + 10, "dur": 500,
                "args": {"correlation": s + 1}},
               {"ph": "X", "cat": "kernel", "name": "vectorized_elementwise_kernel", "ts": s + 520, "dur": 100,
                "args": {"correlation": s + 2}},
               {"ph": "X", "cat": "kernel", "name": "vectorized_elementwise_kernel", "ts": s + 660, "dur": 100,
                "args": {"correlation": s + 3}}]
    c = classify.step_classes({"traceEvents": ev})
    assert c["gpu"] and c["steps"] == 2 and c["step_ms"] == pytest.approx(0.8)
    sh = classify.shares(c)
    assert sh["matmul_fp32"] == pytest.approx(0.625) and sh["elementwise"] == sh["optimizer"] == pytest.approx(0.125)
    assert c["optimizer_range_ms"] == pytest.approx(0.15) and c["kernels_per_step"] == 3


def test_cpu_ops_count_their_own_time():
    ev = [{"ph": "X", "cat": "user_annotation", "name": "gpulab_step", "ts": 0, "dur": 100, "tid": 1},
          {"ph": "X", "cat": "cpu_op", "name": "aten::linear", "ts": 1, "dur": 60, "tid": 1},
          {"ph": "X", "cat": "cpu_op", "name": "aten::addmm", "ts": 2, "dur": 50, "tid": 1},
          {"ph": "X", "cat": "cpu_op", "name": "aten::copy_", "ts": 3, "dur": 10, "tid": 1},
          {"ph": "X", "cat": "cpu_op", "name": "aten::_log_softmax", "ts": 70, "dur": 20, "tid": 1}]
    c = classify.step_classes({"traceEvents": ev})
    assert not c["gpu"] and c["class_ms"]["matmul"] == pytest.approx(0.04)
    assert c["class_ms"]["elementwise"] == pytest.approx(0.01) and "softmax" not in c["class_ms"]


def _gain(v, lo, hi):
    return {"value": v, "lo": lo, "hi": hi, "verdict": "", "basis": "time"}


def test_measured_gains_rank_first_and_a_slower_fix_says_so():
    a = Finding("layout", 0.05, {}, "x", "07", gain=_gain(1.4, 1.3, 1.5))
    b = Finding("launch_bound", 0.45, {}, "x", "03")
    c = Finding("small_batch", 0.3, {}, "x", "06", gain=_gain(1.6, 1.5, 1.7))
    d = Finding("fp32_matmul", 0.5, {}, "x", "02", gain=_gain(0.8, 0.78, 0.83), why="launch-bound")
    assert [f.kind for f in rank([a, b, c, d])] == ["small_batch", "layout", "fp32_matmul", "launch_bound"]
    assert d.slower and "(slower)" in d.gain_text() and not b.measured
    from gpulab.tools.diagnosis.trials import slower_reason

    assert "launch-bound" in slower_reason("fp32_matmul", BEFORE_CASES["launch_bound"])


def test_diagnosis_renders_and_round_trips_through_json():
    found, needs = rules.findings(BEFORE_CASES["small_batch"])
    found[0].gain = _gain(1.6, 1.5, 1.7)
    d = Diagnosis(findings=rank(found), evidence=BEFORE_CASES["small_batch"], needs_gpu=needs, seconds=12.0)
    back = json.loads(json.dumps(d.to_dict()))
    assert back == d.to_dict() and Diagnosis.from_dict(back).to_dict() == back
    assert d.kinds()[0] == "small_batch" and not d.healthy
    assert "small_batch" in str(d) and "1.60x [1.50, 1.70]" in d._repr_html_() and "06_batch_size" in repr(d)
    with pytest.raises(ValueError, match="kind"):
        Finding("slow", 0.1, {}, "", "")


def _tiny():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    make_batch = lambda b: (torch.randn(b, 8), torch.randint(4, (b,)))  # noqa: E731
    for _ in range(2):  # state and grads to keep
        opt.zero_grad()
        F.cross_entropy(model(torch.randn(4, 8)), torch.randint(4, (4,))).backward()
        opt.step()
    return model, opt, make_batch


def _same(a, b):
    return all(torch.equal(a[k], b[k]) for k in a) and a.keys() == b.keys()


def test_a_cpu_run_leaves_model_optimizer_rng_and_settings_as_they_were():
    model, opt, make_batch = _tiny()
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    grads = [p.grad.clone() for p in model.parameters()]
    state = {i: {k: v.clone() for k, v in s.items()} for i, s in enumerate(opt.state.values())}
    old = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32, torch.get_float32_matmul_precision())
    torch.backends.cuda.matmul.allow_tf32 = True  # a reader's own setting, not the default: it must survive
    torch.set_float32_matmul_precision("medium")
    rng = torch.get_rng_state()
    try:
        d = gl.diagnose(model, make_batch, F.cross_entropy, batch_size=4, optimizer=opt, try_fixes=False,
                        progress=False)
        assert torch.backends.cuda.matmul.allow_tf32 is True and torch.get_float32_matmul_precision() == "medium"
        assert torch.backends.cudnn.allow_tf32 == old[1] and torch.equal(torch.get_rng_state(), rng)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = old[0]
        torch.set_float32_matmul_precision(old[2])
    assert _same(weights, model.state_dict())
    assert all(torch.equal(g, p.grad) for g, p in zip(grads, model.parameters()))
    assert all(_same(state[i], s) for i, s in enumerate(opt.state.values()))
    assert d.findings and d.needs_gpu and d.evidence["gpu"] is False and d.evidence["step_ms"] > 0
    assert d.evidence["syncs_per_step"] is None and any("syncs mean nothing" in n for n in d.notes)
    json.dumps(d.to_dict())


def test_a_bare_step_runs_without_fixes():
    x = torch.randn(16, 16)
    d = gl.diagnose(lambda: (x @ x).sum(), progress=False)
    assert d.findings and d.evidence["optimizer"] is None and any("bare step" in n for n in d.notes)


@pytest.mark.parametrize("kwargs,match", [
    (dict(batch_size=0), "batch_size"), (dict(batch_size=-2), "batch_size"), (dict(batch_size=2.5), "batch_size"),
    (dict(batch_size=4, make_batch="not callable"), "make_batch"), (dict(batch_size=4, loss_fn=None), "loss_fn"),
    (dict(batch_size=4, optimizer="adam"), "optimizer"), (dict(batch_size=4, loader=3), "loader"),
    (dict(batch_size=4, try_fixes="yes"), "try_fixes"), (dict(batch_size=4, budget_s=0), "budget_s"),
])
def test_bad_input_is_refused_before_any_work(kwargs, match):
    calls = []
    model = nn.Linear(2, 2)
    model.register_forward_hook(lambda *a: calls.append(1))
    args = dict(make_batch=lambda b: (torch.randn(b, 2), torch.randn(b, 2)), loss_fn=F.mse_loss) | kwargs
    with pytest.raises(ValueError, match=match):
        gl.diagnose(model, args.pop("make_batch"), args.pop("loss_fn"), progress=False, **args)
    assert calls == []
    with pytest.raises(ValueError, match="bare step"):
        gl.diagnose(lambda: None, batch_size=4)


@pytest.mark.parametrize("kind", ["optimizer", "small_batch"])
def test_a_trial_times_the_fix_on_copies(kind):
    from gpulab.tools.diagnosis.trials import Loop, measure

    model, opt, make_batch = _tiny()
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    loop = Loop(model, opt, make_batch, F.cross_entropy, 4, torch.device("cpu"))
    gain, why, cmp = measure(kind, loop, healthy_gpu(gpu=False), seconds=0.3)
    assert gain is not None and gain["lo"] <= gain["value"] <= gain["hi"], why
    assert cmp.headline().value == pytest.approx(gain["value"])  # a measured ratio, whatever its size
    assert _same(weights, model.state_dict()) and opt.param_groups[0]["foreach"] is None


def test_a_trial_fits_as_many_rounds_as_its_seconds_allow():
    """Five interleaved pairs where the step is short (their range holds the median 94% of the time), two where a
    round of four steps takes most of the budget; the plan's seconds stay within the trial's."""
    from gpulab.tools.diagnosis.trials import MAX_ROUNDS, trial_plan

    short = trial_plan(15.0, 0.013)  # the H200's NCHW convnet: 13 ms steps
    assert short["rounds"] == MAX_ROUNDS and short["round_s"] == pytest.approx(1.0)
    slow = trial_plan(20.0, 0.6)  # a GPT-2 step of 0.6 s: a round is at least four of them
    assert slow["rounds"] == 2 and slow["round_s"] == pytest.approx(2.4)
    for plan, seconds in ((short, 15.0), (trial_plan(60.0, 0.1), 60.0)):
        assert 2 * plan["min_time_s"] + 2 * plan["rounds"] * plan["round_s"] <= seconds + 1e-9


def test_an_untriable_fix_says_why():
    from gpulab.tools.diagnosis.trials import Loop, untried

    model, opt, make_batch = _tiny()
    loop = Loop(model, opt, make_batch, F.cross_entropy, 4, torch.device("cpu"))
    assert "needs a GPU" in untried("fp32_matmul", loop, 100.0) and "bare step" in untried("layout", None, 100.0)
    assert "no loader" in untried("data_wait", loop, 100.0) and "compile" in untried("launch_bound", loop, 100.0)


def test_a_loader_feeds_the_step_and_its_wait_is_measured():
    model, opt, make_batch = _tiny()
    data = torch.utils.data.TensorDataset(*make_batch(32))
    loader = torch.utils.data.DataLoader(data, batch_size=4)
    d = gl.diagnose(model, make_batch, F.cross_entropy, batch_size=4, optimizer=opt, loader=loader,
                    try_fixes=False, progress=False)
    assert 0.0 <= d.evidence["loader_wait_share"] <= 1.0 and d.evidence["loader_wait_ms"] >= 0.0


def test_the_loader_trial_times_both_loaders_as_pipelines_on_endless_copies():
    """Timed step by step, a queue its workers filled while the other side ran made most steps look instant (53x
    from eight workers on the H200): both sides are pipelines, rates over whole windows on settled queues."""
    from gpulab.measuring.device import usable_cores
    from gpulab.tools.diagnosis.rules import suggested_workers
    from gpulab.tools.diagnosis.trials import Loop, loaders, measure

    model, opt, make_batch = _tiny()
    cores = usable_cores()
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(*make_batch(8)), batch_size=4)
    given, faster = loaders(loader, torch.device("cpu"), suggested_workers(cores))
    assert (given.num_workers, faster.num_workers >= 2, faster.batch_size) == (0, True, 4)
    assert len(given.sampler) > 10**9  # endless: no epoch boundary restarts workers mid-window
    loop = Loop(model, opt, make_batch, F.cross_entropy, 4, torch.device("cpu"), loader)
    gain, why, cmp = measure("data_wait", loop, {"step_ms": 1.0, "cores": cores}, 3.0)
    assert gain is not None and cmp.before.pipeline and cmp.after.pipeline, why
    assert (cmp.before.label, cmp.after.label) == ("your loader (0 workers)", f"{faster.num_workers} workers")
    with pytest.raises(TypeError, match="not a torch DataLoader"):
        loaders([(1, 2)], torch.device("cpu"), 2)


def test_the_loader_fix_names_the_workers_its_trial_runs():
    from gpulab.tools.diagnosis.rules import suggested_workers

    assert [suggested_workers(c) for c in (1, 4, 16, None)] == [2, 4, 8, 8]
    gpu = rules.data_wait(dict(BEFORE_CASES["data_wait"], cores=4))
    cpu = rules.data_wait(dict(BEFORE_CASES["data_wait"], cores=16, gpu=False))
    assert "num_workers=4, pin_memory=True" in gpu.fix and "num_workers=8, persistent" in cpu.fix


def test_the_profile_replays_batches_so_a_slow_loader_stays_out_of_it(monkeypatch):
    """A main-process decode of many small ops made the profile take 51 s on a 15 s budget (the H200's starving
    loader): the profile now runs on batches drawn before it, and the loader's wait is added back as idle."""
    from gpulab.tools.diagnosis import evidence as E

    model, opt, make_batch = _tiny()
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(*make_batch(32)), batch_size=4)
    feed = E.BatchSource(loader, torch.device("cpu"))
    drawn = {}

    def profile_evidence(step, step_ms):
        before = feed.taken
        for _ in range(5):
            step()
        drawn["while profiling"] = feed.taken - before
        return {"profiled_step_ms": 10.0, "classes": {"matmul_fp32": 0.5}, "kernels_per_step": 3.0,
                "optimizer_range_ms": 1.0, "busy": 0.8, "idle": {"host_launching": 0.1, "after_sync": 0.0,
                                                                "queued": 0.1}, "sync_wait": 0.0}

    monkeypatch.setattr(E, "profile_evidence", profile_evidence)
    step = lambda: feed.next()  # noqa: E731
    ev = E.collect(step, device=torch.device("cpu"), feed=feed, min_time_s=0.01)
    assert drawn["while profiling"] == 0 and ev["loader_wait_share"] is not None


def test_a_replayed_profile_becomes_shares_of_the_whole_step():
    from gpulab.tools.diagnosis.evidence import with_loader_wait

    prof = {"profiled_step_ms": 30.0, "classes": {"matmul_tc": 0.6}, "busy": 0.7, "sync_wait": 0.1,
            "idle": {"host_launching": 0.2, "after_sync": 0.1, "queued": 0.0}}
    out = with_loader_wait(prof, 0.25)  # the step waits a quarter of its time for data
    assert out["profiled_step_ms"] == pytest.approx(40.0) and out["classes"]["matmul_tc"] == pytest.approx(0.45)
    assert out["busy"] == pytest.approx(0.525) and out["sync_wait"] == pytest.approx(0.075)
    assert out["idle"] == pytest.approx({"host_launching": 0.4, "after_sync": 0.075, "queued": 0.0})
    assert out["busy"] + sum(out["idle"].values()) == pytest.approx(prof["busy"] + sum(prof["idle"].values()))
    assert with_loader_wait(prof, 0.0) == prof


def test_the_gpu_script_runs_a_case_at_smoke_size(tmp_path):
    """tests/gpu_diagnose_cases.py (run by hand on a GPU) on one case at tiny sizes: a JSON and a summary row."""
    import importlib.util
    from pathlib import Path

    spec = importlib.util.spec_from_file_location("gpu_cases", Path(__file__).parent / "gpu_diagnose_cases.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.main(["--out", str(tmp_path), "--smoke", "--only", "batch_8", "--budget", "2"]) == 0
    rec = json.loads((tmp_path / "batch_8.json").read_text())
    assert rec["planted"] == "small_batch" and rec["diagnosis"]["kinds"]
    assert "| batch_8 | small_batch |" in (tmp_path / "summary.md").read_text()


# Recorded on the H200 (gl.diagnose's evidence, trimmed): 8 checked layers of 4096, 9 syncs per step.
SYNC_GPU_BOUND = healthy_gpu(  # batch 8192: the host blocks 40% of the step in syncs, the GPU idles after each
    batch_size=8192, busy=0.805, idle={"host_launching": 0.122, "after_sync": 0.048, "queued": 0.021},
    sync_wait=0.404, syncs_per_step=9.0, kernels_per_step=145.0, memory_headroom=0.9, mfu=None,
    classes={"elementwise": 0.192, "matmul_tc": 0.540, "optimizer": 0.071, "attention_fused": 0.0})
SYNC_HOST_BOUND = SYNC_GPU_BOUND | {  # batch 2048: the host is slower than the GPU, syncs or not
    "busy": 0.502, "idle": {"host_launching": 0.402, "after_sync": 0.069, "queued": 0.023}, "sync_wait": 0.026}


def test_a_sync_owns_the_idle_of_the_queue_it_drained():
    found, _ = rules.findings(SYNC_GPU_BOUND)
    assert [f.kind for f in found] == ["sync"]  # the refill gaps are the sync's, not launch overhead
    assert found[0].share == pytest.approx(0.191, abs=1e-3) and found[0].evidence["host_blocked_in_syncs"] == 0.404
    # a host that barely waits in its syncs is slower than the GPU anyway: launch-bound first, the sync after
    found, _ = rules.findings(SYNC_HOST_BOUND)
    assert [f.kind for f in found] == ["launch_bound", "sync"] and found[1].share == pytest.approx(0.069)
    # no sync per step: its idle is launch overhead, whatever the host's wait
    assert rules.sync_share(SYNC_GPU_BOUND | {"syncs_per_step": 0.0}) == 0.0


def test_manual_attention_owns_its_score_matrix_kernels():
    """Classes recorded on the H200 for nanoGPT's manual attention (4 layers, t=1024, BF16): first, not elementwise."""
    ev = healthy_gpu(classes={"elementwise": 0.149, "matmul_tc": 0.126, "attention_manual": 0.585, "other": 0.065,
                              "optimizer": 0.007, "attention_fused": 0.0}, batch_size=16)
    found, _ = rules.findings(ev)
    assert found[0].kind == "attention" and found[0].share == pytest.approx(0.585)


def _launch(ts, corr, tid=1):
    return {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": ts, "dur": 2, "tid": tid,
            "args": {"correlation": corr}}


def _kernel(name, ts, dur, corr):
    return {"ph": "X", "cat": "kernel", "name": name, "ts": ts, "dur": dur, "args": {"correlation": corr}}


def _op(name, ts, dur, dims=None, tid=1):
    return {"ph": "X", "cat": "cpu_op", "name": name, "ts": ts, "dur": dur, "tid": tid,
            "args": {"Input Dims": dims or []}}


def test_a_hand_written_attention_path_from_a_trace():
    """scale (a mul on a (b, h, t, t) matrix), mask, softmax and the batched matmul are attention; the MLP's GELU
    (a 3-D tensor) stays elementwise; with a fused attention kernel in the step nothing is reassigned."""
    ev = [{"ph": "X", "cat": "user_annotation", "name": "gpulab_step", "ts": 0, "dur": 1000},
          _op("aten::bmm", 10, 20), _launch(12, 1), _kernel("nvjet_tst_128x64_h_bz_NNT", 100, 50, 1),
          _op("aten::mul", 40, 20, [[8, 12, 64, 64], []]), _launch(42, 2),
          _kernel("vectorized_elementwise_kernel<4, MulFunctor>", 150, 40, 2),
          _op("aten::masked_fill", 70, 20, [[8, 12, 64, 64], [64, 64], []]), _launch(72, 3),
          _kernel("vectorized_elementwise_kernel<4, masked_fill>", 190, 40, 3),
          _op("aten::softmax", 100, 30), _op("aten::_softmax", 105, 20, [[8, 12, 64, 64]]), _launch(110, 4),
          _kernel("softmax_warp_forward<c10::BFloat16, c10::BFloat16, float, 6, false, false>", 230, 60, 4),
          _op("aten::gelu", 140, 20, [[8, 64, 3072]]), _launch(142, 5),
          _kernel("vectorized_elementwise_kernel<4, GeluCUDAKernelImpl>", 290, 100, 5)]
    c = classify.step_classes({"traceEvents": ev})
    assert c["class_ms"]["attention_manual"] == pytest.approx(0.19) and c["class_ms"]["elementwise"] == 0.1
    fused = ev + [_kernel("flash_fwd_kernel", 400, 10, 6)]
    assert "attention_manual" not in classify.step_classes({"traceEvents": fused})["class_ms"]


def test_the_host_blocked_in_syncs_from_a_trace():
    ev = [{"ph": "X", "cat": "user_annotation", "name": "gpulab_step", "ts": 0, "dur": 1000},
          _kernel("ampere_sgemm_64x64", 0, 900, 1),
          {"ph": "X", "cat": "cuda_runtime", "name": "cudaStreamSynchronize", "ts": 100, "dur": 800, "tid": 1}]
    assert classify.step_classes({"traceEvents": ev})["sync_wait_ms"] == pytest.approx(0.8)


def test_hopper_cublas_kernels_are_tensor_core_matmuls():
    assert classify.kernel_class("nvjet_tst_256x128_64x4_2x1_v_bz_coopA_TNT") == "matmul_tc"


def test_trials_run_by_expected_value_with_compile_last():
    from gpulab.tools.diagnosis import trial_order, trial_seconds

    f = lambda kind, share: Finding(kind, share, {}, "x", "03")  # noqa: E731
    todo = trial_order([f("launch_bound", 0.6), f("layout", 0.05), f("small_batch", 0.5), f("elementwise", 0.3)])
    assert [t.kind for t in todo] == ["small_batch", "layout", "launch_bound", "elementwise"]
    # with 130 s left, the two cheap trials leave torch.compile its minimum; with 40 s, they share what is left
    assert trial_seconds(todo, 130.0) == 20.0 and trial_seconds(todo[1:], 105.0) == 15.0
    assert trial_seconds(todo, 40.0) == 10.0
    assert trial_seconds([f("small_batch", 0.5)], 12.0) == 12.0


def test_the_autocast_trial_really_runs_under_autocast():
    """fp32_matmul's "after" step runs its matmuls in BF16 (its "before" in FP32), even in a model that enters an
    autocast region of its own only when asked to, as the GPU script's GPT-2 does."""
    from gpulab.tools.diagnosis.trials import Loop, pair

    model, opt, make_batch = _tiny()
    seen = []
    model.register_forward_hook(lambda m, i, out: seen.append(out.dtype))
    before, after, _ = pair(Loop(model, opt, make_batch, F.cross_entropy, 4, torch.device("cpu")), "fp32_matmul")
    before()
    after()
    assert seen == [torch.float32, torch.bfloat16]


def test_the_gpu_scripts_gpt2_keeps_a_callers_autocast():
    import importlib.util
    from pathlib import Path

    spec = importlib.util.spec_from_file_location("gpu_cases", Path(__file__).parent / "gpu_diagnose_cases.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    model = mod.GPT2LMHeadModel(64, 32, 1, 2, 16)
    with torch.autocast("cpu", torch.bfloat16):
        assert model(torch.randint(64, (2, 8))).logits.dtype == torch.bfloat16
