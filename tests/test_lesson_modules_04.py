"""Notebook 04's scaffolding on the CPU: its smoke sizes, its claims as data, the verdicts on what it measured (on
the CPU: not tested, and why; on a pretend GPU: judged on the reference GPU's numbers and on fakes), and the tables,
sentences and figures that report it."""
import json
from pathlib import Path
from types import SimpleNamespace

import matplotlib
import pytest
import torch

import gpulab as gl
from gpulab.claims import Estimate
from gpulab.device import DeviceInfo
from gpulab.lesson import NEEDS, _as_spec
from gpulab.lessons import sync_claims as C
from gpulab.lessons import sync_lab as sl
from gpulab.lessons import sync_lesson as L
from gpulab.results import comparisons
from _notebook_run import parameters_cell

matplotlib.use("Agg")
ROOT = Path(__file__).resolve().parent.parent
NOTEBOOK = ROOT / "notebooks" / "04_sync_points.ipynb"
REF = json.loads((ROOT / "data" / "reference" / "nvidia-h100-80gb-hbm3" / "04_sync_points.json").read_text())


def _parameters() -> dict:
    return parameters_cell("04_sync_points")


def _lesson(device, smoke=True, **params):
    ns = _parameters() | {"SMOKE": smoke} | params
    les = gl.lesson("04_sync_points", ns, full={}, claims=L.CLAIMS, device=device, show=False)
    L.use_sizes(les, ns)
    return les


@pytest.fixture
def cpu_lesson(cpu_device):
    threads = torch.get_num_threads()
    yield _lesson(cpu_device)
    torch.set_num_threads(threads)


@pytest.fixture
def gpu_lesson(monkeypatch):
    """A lesson on a pretend GPU at full sizes, every need met: for the verdicts a GPU run reaches."""
    monkeypatch.setitem(NEEDS, "cuda", lambda lesson: None)
    return _lesson(DeviceInfo(kind="cuda", name="pretend GPU", capability=(9, 0)), smoke=False)


@pytest.fixture
def ref_cmps():
    """The reference GPU's comparisons, by name: real profiles and intervals, as a GPU run makes them."""
    return {c.name: c for c in comparisons(REF)}


def _copy_timings() -> dict:
    fields = ("label", "host_s", "device_s", "nbytes", "fractions")
    return {k: sl.CopyTiming(**{f: v[f] for f in fields}) for k, v in REF["extra"]["copy_timing"].items()}


def _queued(host, queued=0.02, copy=0.01):
    host = host if isinstance(host, list) else [host] * 5
    return sl.QueuedCopyTiming("q", host, [queued] * len(host), [copy] * len(host))


def _by_text(res) -> dict:
    return {c.text: c for c in res.claims}


def test_claims_are_valid_specs_and_keep_the_contracts_texts():
    specs = [_as_spec(c) for c in L.CLAIMS]
    assert len({s.key for s in specs}) == len(specs)
    contract = json.loads((ROOT / "tests" / "data" / "notebook_contract.json").read_text())["04_sync_points"]
    assert sorted(s.text for s in specs) == sorted(contract["claims"])
    assert all(s.needs == ("cuda",) for s in specs)  # on a CPU a sync costs nothing, and nothing counts it
    assert {k for k, _ in C.SYNC_VARIANTS} <= {s.key for s in specs}


def test_the_sync_claims_count_variants_the_notebook_defines():
    code = "".join("".join(c["source"]) for c in json.loads(NOTEBOOK.read_text())["cells"] if c["cell_type"] == "code")
    for _, variant in C.SYNC_VARIANTS + [(None, C.BASELINE)]:
        assert f'"{variant}"' in code, variant
    assert 'f"summed on GPU, one read per {STEPS_PER_CALL} steps"' in code


def test_use_sizes_puts_smoke_sizes_in_the_namespace_and_records_them(cpu_device):
    threads = torch.get_num_threads()
    try:
        ns = _parameters() | {"SMOKE": True}
        les = gl.lesson("04_sync_points", ns, full={}, claims=L.CLAIMS, device=cpu_device, show=False)
        params = L.use_sizes(les, ns)
        assert ns["MODEL"]["n_layer"] == 1 and ns["BATCH"] == 2 and ns["STEPS_PER_CALL"] == 2
        assert ns["MIN_TIME_S"] == ns["LOOP_MIN_TIME_S"] == L.SMOKE_MIN_TIME_S and ns["LOOP_ROUNDS"] == 3
        assert list(params) == list(L.PARAMS) and les.result.params == params and les.result.smoke
        assert les.spec("accumulate").unit == "syncs per 2 steps"
        assert L.SMOKE_SIZES["MODEL"] is not ns["MODEL"]  # the notebook may change its copy
        ns2 = _parameters() | {"SMOKE": True, "MIN_TIME_S": 0.2}  # a reader's MIN_TIME_S is kept
        L.use_sizes(gl.lesson("04_sync_points", ns2, full={}, device=cpu_device, show=False), ns2)
        assert ns2["MIN_TIME_S"] == ns2["LOOP_MIN_TIME_S"] == 0.2
    finally:
        torch.set_num_threads(threads)


def test_full_sizes_on_a_gpu_are_the_parameters_cell_unchanged(gpu_lesson):
    want = _parameters()
    assert not gpu_lesson.small and not gpu_lesson.result.smoke
    assert gpu_lesson.result.params == {k: want[k] for k in L.PARAMS}
    assert gpu_lesson.spec("accumulate").unit == f"syncs per {want['STEPS_PER_CALL']} steps"


def test_phases_time_the_marked_sections_and_the_total():
    clock = L.Phases()
    clock.mark()
    clock.lap("1-4 loops")
    clock.mark()
    clock.lap("6 copies and streams")
    d = clock.to_dict()
    assert list(d) == ["1-4 loops", "6 copies and streams", "total"] and d["total"] >= d["1-4 loops"] >= 0


def test_on_a_cpu_every_claim_is_not_tested_and_says_why(cpu_lesson, ref_cmps):
    cmp = next(iter(ref_cmps.values()))
    L.check_item(cpu_lesson, cmp, cmp)
    L.check_eval(cpu_lesson, cmp, 4)
    L.check_zero_grad(cpu_lesson, cmp)
    L.check_syncs(cpu_lesson, {}, None, 2)  # `found` is {} without CUDA: nothing may index it
    L.check_numpy_int(cpu_lesson, lambda: 1 / 0, lambda: 1 / 0, lambda: 1 / 0)  # nothing is run on a CPU
    L.check_copies(cpu_lesson, None, {}, 16)
    L.check_overlap(cpu_lesson, None)
    assert cpu_lesson.pending() == []
    claims = cpu_lesson.result.claims
    assert len(claims) == len(L.CLAIMS) and {c.verdict for c in claims} == {"not tested"}
    counted = {s.text for s in map(_as_spec, L.CLAIMS) if s.unit.startswith("syncs")}
    for c in claims:
        assert c.note == (C.NO_DEBUG_MODE if c.text in counted else C.NOT_GPU), c.text
    assert _by_text(cpu_lesson.result)[C.CLAIMS[9]["text"]].unit == "syncs per 2 steps"


def test_timing_claims_on_a_gpu_read_percent_faster_off_the_speedup(gpu_lesson, ref_cmps):
    twice, item = ref_cmps["training loop: two .item() per step vs one"], \
        ref_cmps["training loop: .item() every step vs losses summed on the GPU"]
    c_twice, c_item = L.check_item(gpu_lesson, twice, item)
    est = twice.estimate()
    assert c_twice.measured == pytest.approx((est.value - 1) * 100)
    assert c_twice.interval == pytest.approx(((est.lo - 1) * 100, (est.hi - 1) * 100))
    assert c_item.verdict in ("confirmed", "refuted", "inconclusive")
    assert L.check_eval(gpu_lesson, ref_cmps["eval loop: .cpu() every batch vs one transfer at the end"],
                        8).note == "eval loop of 8 batches, GPT forward"
    assert L.check_zero_grad(gpu_lesson, ref_cmps["zero_grad: set_to_none=False vs True"]).verdict != "not tested"
    assert L.pct_faster(SimpleNamespace(estimate=lambda: Estimate(1.1, 1.05, 1.2))).value == pytest.approx(10)


def test_sync_counts_on_a_gpu_subtract_what_a_plain_step_makes(gpu_lesson):
    found = {"no read-back at all": 1, "loss[mask].mean()": 2, "torch.where masked mean": 1,
             ".item() once per step": 2, "loss.cpu() per step": 2, "if loss.sum() > 0: per step": 1,
             "summed on GPU, one read per 8 steps": 9}
    out = {c.text: c for c in L.check_syncs(gpu_lesson, found, logging_syncs=3, steps=8)}
    verdicts = {t: (c.measured, c.verdict) for t, c in out.items()}
    assert verdicts["boolean-mask indexing forces a CPU-GPU sync"] == (1, "confirmed")
    assert verdicts["the same masked mean with torch.where stays on the GPU"] == (0, "confirmed")
    assert verdicts["dynamic control flow (`if tensor.sum() > 0:`) forces a CPU-GPU sync"] == (0, "refuted")
    assert verdicts["accumulate on the GPU, log every N steps: one sync per N steps"] == (1, "confirmed")
    assert verdicts["a logging thread moves the .item() sync off the training loop"] == (1, "refuted")
    assert all("minus the 1 sync(s)" in c.note for t, c in out.items() if "logging" not in t)
    assert all(c.evidence == "measured" and c.interval == (c.measured, c.measured) for c in out.values())


def test_numpy_on_a_gpu_tensor_raises_and_says_so_while_int_max_is_counted(gpu_lesson, monkeypatch):
    calls = []

    def fake_find_syncs(fn):
        calls.append(fn)
        return ["synchronizing"] * fn()

    def to_numpy():
        raise TypeError("can't convert cuda:0 device type tensor to numpy.\nUse Tensor.cpu() first.")

    monkeypatch.setattr(C.profiling, "find_syncs", fake_find_syncs)
    c_np, c_int = L.check_numpy_int(gpu_lesson, to_numpy, alloc=lambda: 2, reduce=lambda: 1)
    assert c_np.verdict == "not tested" and "raises TypeError (can't convert cuda:0" in c_np.note
    assert "Use Tensor" not in c_np.note  # the first line only
    assert (c_int.measured, c_int.verdict) == (1, "confirmed") and len(calls) == 3
    gpu_lesson.result.claims.clear()
    c_np, _ = L.check_numpy_int(gpu_lesson, lambda: 1, alloc=lambda: 1, reduce=lambda: 1)
    assert (c_np.measured, c_np.verdict) == (1, "confirmed")
    assert L.check_numpy_int(gpu_lesson, lambda: (_ for _ in ()).throw(TypeError()), lambda: 1,
                             lambda: 1)[0].verdict == "not tested"  # an empty message does not crash


def test_copies_and_overlap_on_a_gpu_are_judged_on_the_reference_numbers(gpu_lesson, ref_cmps):
    copy_t = _copy_timings()
    pin = ref_cmps["host-to-device copy: pageable vs pinned + non_blocking"]
    c_pin, c_nb, c_pg = L.check_copies(gpu_lesson, pin, copy_t, 256)
    assert c_pin.note.startswith("256 MiB copy") and c_pin.verdict != "not tested"
    assert c_nb.measured == pytest.approx(copy_t["pinned_non_blocking"].fraction_estimate().value * 100)
    assert c_pg.unit == "%" and c_pg.verdict != "not tested"
    assert L.check_overlap(gpu_lesson, Estimate(95, 90, 99)).verdict == "confirmed"
    assert L.check_overlap(gpu_lesson, None).note.startswith("share of the shorter task")  # not run: says what


def test_reports_of_a_gpu_run_say_busy_time_and_syncs(ref_cmps):
    item = ref_cmps["training loop: .item() every step vs losses summed on the GPU"]
    twice = ref_cmps["training loop: two .item() per step vs one"]
    lines = L.gaps(item).splitlines()
    assert len(lines) == 2 and all("GPU busy" in line and "synchronizing calls per call" in line for line in lines)
    text = L.loop_report(twice, item, 8)
    assert f"**{twice.verdict}**" in text and "every 8 steps" in text and "second `.item()`" in text
    assert L.verdict_report("Masks", item).startswith(f"Masks: **{item.verdict}**.")
    html = L.profiler_syncs_html(list(ref_cmps.values()), gpu=True)
    assert html.count("<tr>") == len(ref_cmps) + 1
    assert L.profiler_syncs_html(list(ref_cmps.values()), gpu=False) == ""


def test_reports_without_a_gpu_trace_say_so():
    side = SimpleNamespace(label="eager", profile=None)
    assert L.gaps(SimpleNamespace(before=side, after=side)).count("no GPU trace on this machine") == 2


def test_sync_table_lists_each_variant_and_the_logging_recipe():
    html = L.sync_table_html({"a": 1, "b": 0}, 2)
    assert html.count("<tr>") == 4 and "guide §4.3 async logging (per logged step)</td><td>2" in html


def test_copy_tables_and_reports():
    copy_t = _copy_timings()
    assert L.copy_table_html(copy_t).count("<tr>") == len(copy_t) + 1
    text = L.copy_report(SimpleNamespace(verdict="faster (2.0x)"), copy_t)
    assert "**faster (2.0x)**" in text and "only frees the CPU when the source is pinned" in text
    assert L.copy_report(None, {}) == ""


@pytest.mark.parametrize("host, says", [(0.029, "a hidden sync"), (0.005, "not for the queued work"),
                                        ([0.005, 0.01, 0.02, 0.029, 0.03], "within the spread")])
def test_queued_report_says_whether_the_pageable_copy_waited_for_queued_work(host, says):
    queued = {"pageable_non_blocking": _queued(host), "pinned_non_blocking": _queued(0.0001)}
    text = L.queued_report(queued)
    assert says in text and "the copy ran after it without the CPU" in text
    assert L.queued_table_html(queued).count("<tr>") == 3


def test_record_overlap_keeps_the_result_keys(cpu_lesson):
    est = Estimate(1.5, 1.4, 1.6)
    cmp = SimpleNamespace(estimate=lambda: est, before=SimpleNamespace(seconds=0.03),
                          after=SimpleNamespace(seconds=0.02))
    m_copy = SimpleNamespace(median=0.012, median_estimate=lambda: Estimate(0.012, 0.011, 0.013))
    m_comp = SimpleNamespace(median=0.010, median_estimate=lambda: Estimate(0.010, 0.009, 0.011))
    ov = SimpleNamespace(repeats=3)
    hidden = L.record_overlap(cpu_lesson.result, ov, cmp, m_copy, m_comp)
    assert hidden.value == pytest.approx(100)  # saved 0.01 s of the shorter task's 0.01 s
    rec = cpu_lesson.result.extra["overlap"]
    assert list(rec) == ["copy_s", "compute_s", "serial_s", "hidden_pct", "overlapped_s", "hidden_interval",
                         "matmuls_per_chunk"]
    assert "hid **100%**" in L.overlap_report(ov, cmp, m_copy, m_comp, hidden)


def test_setup_note_on_a_cpu(cpu_lesson):
    assert L.setup_note(cpu_lesson).startswith("**No CUDA GPU.**")


def test_figures_draw_with_and_without_a_reference(ref_cmps, monkeypatch):
    shown = []
    monkeypatch.setattr("IPython.display.display", lambda *a, **k: shown.append(a))
    loops = list(ref_cmps.values())[:5]
    L.mfu_figure(loops, REF)
    L.busy_figure(list(ref_cmps.values()) + [None, None], REF)
    L.busy_figure([SimpleNamespace(name="x: y", before=SimpleNamespace(label="a", profile=None),
                                   after=SimpleNamespace(label="b", profile=None))], None)
    assert shown and "nothing to compare" in shown[-1][0].data
    L.timeline(loops[0], gpu=False)
