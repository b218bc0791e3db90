import json
import os
import subprocess
import sys
from pathlib import Path

import matplotlib
import pytest

from gpulab.app import course
from gpulab.app.readme import README_MARKERS, reference_section, update_readme
from gpulab.display import plots
from gpulab.__main__ import main
from gpulab.measuring.monitor import Trace
from test_results import make_result

matplotlib.use("Agg")  # tests only: no display here; the library itself never picks a backend


def _write_fixtures(folder):
    make_result("01_measuring", speedup=2.5).save(folder)
    make_result("02_tensor_cores", speedup=1.0).save(folder)
    slug = folder / "nvidia-h100-80gb-hbm3"
    (slug / "03_fusion.json").write_text("{ this is not json")
    (slug / "04_sync_points.json").write_text(json.dumps({"notebook": "04_sync_points"}))
    return slug


def test_summary_from_fixtures_reports_missing_and_malformed_and_keeps_the_rest(tmp_path):
    slug = _write_fixtures(tmp_path / "results")
    ref = tmp_path / "ref"
    make_result("01_measuring", speedup=3.0).save(ref)
    md, png = course.write_summary(slug, tmp_path / "out", compare=ref / "nvidia-h100-80gb-hbm3",
                                   expected=["01_measuring", "02_tensor_cores", "05_data_overlap"])
    text = md.read_text()
    assert "| 01_measuring | bf16 autocast | optimisation | 2.50x |" in text
    assert "| 02_tensor_cores | bf16 autocast | optimisation | 1.00x |" in text
    assert "3.00x" in text  # the reference speedup beside this run's
    assert "skipped 03_fusion.json: " in text and "not valid JSON" in text
    assert "skipped 04_sync_points.json: " in text and "missing keys" in text
    assert "missing: no result for 05_data_overlap" in text
    assert "| 01_measuring | 2-3x faster | guide | 2–3x | 2.50x | confirmed" in text
    assert "| 1 | 2.50x: bf16 autocast | 1 | 0 | 0 | 0 | 0 | 0 | 0 | — |" in text  # the per-notebook table
    assert png.read_bytes()[:4] == b"\x89PNG"


def test_notebook_selection():
    names = [p.stem for p in course.notebooks()]
    assert names == sorted(names) and len(names) == 11 and names[-1] == "11_your_model"
    assert [p.stem for p in course.notebooks(["3", "01"])] == [names[2], names[0]]
    with pytest.raises(ValueError, match="not found; choose from"):
        course.notebooks(["99"])


def test_run_picks_smoke_sizes_without_a_gpu_unless_full_is_asked():
    from gpulab.__main__ import choose_smoke
    assert choose_smoke(False, False, has_cuda=False)[0] is True
    assert "--full" in choose_smoke(False, False, has_cuda=False)[1]
    assert choose_smoke(False, True, has_cuda=False) == (False, None)
    assert choose_smoke(False, False, has_cuda=True) == (False, None)
    assert choose_smoke(True, False, has_cuda=True) == (True, None)
    with pytest.raises(SystemExit):  # --smoke and --full contradict each other
        main(["run", "--smoke", "--full", "01"])


def test_cli_rejects_unknown_notebook_with_exit_2(capsys):
    assert main(["run", "--smoke", "42"]) == 2
    assert "not found" in capsys.readouterr().err


def test_cli_info_json_on_this_machine():
    out = subprocess.run([sys.executable, "-m", "gpulab", "info", "--json"], capture_output=True, text=True,
                         check=True).stdout
    report = json.loads(out[out.index("{"):])
    assert "device" in report and "monitoring" in report
    assert report["monitoring"]["cpu_percent"] == "ok"


@pytest.mark.notebook
def test_runner_on_two_notebooks_in_smoke_mode(tmp_path, monkeypatch):
    pytest.importorskip("papermill")
    results = tmp_path / "results"
    monkeypatch.setenv("GPULAB_RESULTS", str(results))
    run = course.run_course(["01", "04"], smoke=True, out=tmp_path / "run", progress=False)
    assert [r.notebook for r in run.runs] == ["01_measuring", "04_sync_points"]
    assert run.ok, [r.error for r in run.runs]
    assert (tmp_path / "run" / "01_measuring.ipynb").exists()
    text = run.summary_md.read_text()
    assert "| 01_measuring |" in text and "| 04_sync_points |" in text and "## Problems" not in text


def test_runner_reports_a_failing_notebook_and_goes_on(tmp_path, monkeypatch):
    pytest.importorskip("papermill")
    import papermill as pm

    def fake_execute(src, dst, **kwargs):
        if "01_" in src:
            raise RuntimeError("cell 3 failed")

    monkeypatch.setattr(pm, "execute_notebook", fake_execute)
    run = course.run_course(["01", "02"], smoke=True, out=tmp_path / "run", results=tmp_path / "none",
                            progress=False)
    assert [r.ok for r in run.runs] == [False, True] and "cell 3 failed" in run.runs[0].error
    text = run.summary_md.read_text()
    assert not run.ok and "02_tensor_cores ran but wrote no result file" in text
    assert "01_measuring failed: RuntimeError: cell 3 failed; its results are not shown" in text


def test_a_run_id_already_set_is_kept_so_several_calls_share_one_peak_measurement(tmp_path, monkeypatch):
    pytest.importorskip("papermill")
    import papermill as pm

    seen = []
    monkeypatch.setattr(pm, "execute_notebook", lambda *a, **k: seen.append(os.environ["GPULAB_RUN_ID"]))
    monkeypatch.setenv("GPULAB_RUN_ID", "ref-1")
    course.run_course(["01"], smoke=True, out=tmp_path / "a", progress=False)
    monkeypatch.delenv("GPULAB_RUN_ID")
    course.run_course(["01"], smoke=True, out=tmp_path / "b", progress=False)
    assert seen[0] == "ref-1" and seen[1].startswith("b-") and "GPULAB_RUN_ID" not in os.environ


def test_every_plot_draws_from_result_objects():
    r = make_result()
    cmp = r.experiments[0]
    tr = Trace(duration_s=1.0, series={"nvml_util": [(0.0, 10.0), (0.5, 90.0)]}, available={"nvml_util": "ok"})
    cmp.after.trace = tr
    figs = [plots.timeline(cmp), plots.timeline(("a", tr), ("b", None)), plots.mfu(cmp, reference=[cmp]),
            plots.speedups(cmp, reference=[cmp.to_dict()]),
            plots.sweep([1, 2, 3], {"x": [1.0, None, 3.0]}, xlabel="n", ylabel="y", hlines={"peak": 4.0},
                        ref={"x": ([1, 2], [2.0, 2.5])}),
            plots.roofline([("n=256", 40.0, 50.0), ("n=8192", 2700.0, 780.0)], peak_tflops=790, bandwidth_gbs=3000),
            plots.waterfall([("naive", 1000.0), ("bf16", 3000.0)], ref=[("naive", 1200.0)])]
    assert all(f.axes for f in figs)
    with pytest.raises(ValueError, match="peak_tflops"):
        plots.roofline([], peak_tflops=0, bandwidth_gbs=1)


def test_readme_reference_section_matches_the_committed_reference_run(monkeypatch):
    root = Path(__file__).resolve().parents[1]
    start, end = README_MARKERS
    section = (root / "README.md").read_text().split(start)[1].split(end)[0].strip()
    monkeypatch.chdir(root)  # the section names the folder as the README links it: relative to the repository
    assert section == reference_section("data/reference/nvidia-h200").strip(), \
        "README out of date: python -m gpulab summary data/reference/<gpu> --readme README.md"


def test_update_readme_needs_one_marker_pair(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text("# x\n\nno markers\n")
    with pytest.raises(ValueError, match="reference-summary"):
        update_readme(readme, "data/reference/nvidia-h200")
    assert readme.read_text() == "# x\n\nno markers\n"  # untouched


def test_a_timeline_panel_with_too_few_samples_gives_its_mean_not_a_line():
    """GPM reads once a second: a 2-second window gives 2 points, which a line would present as a trend."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    from gpulab.display import plots
    from gpulab.measuring.monitor import Trace

    many = Trace(series={"nvml_util": [(i / 10, 50.0 + i) for i in range(20)], "gpm_sm_active": [(0.5, 40.0), (1.5, 60.0)]})
    fig = plots.timeline(("loop", many), metrics=("nvml_util", "gpm_sm_active"))
    (nvml,) = fig.axes  # the GPM panel is left out: its mean is in the legend
    assert len(nvml.lines) == 1 and not nvml.texts
    assert "loop; mean SM active 50.0% (GPM)" in nvml.get_legend().get_texts()[0].get_text()


def test_mfu_bars_draw_a_shared_before_side_once():
    """Every fix of notebook 09 is measured against the same slow loop: one bar for it, not one per fix."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    from gpulab.display import plots

    a = make_result().experiments[0]
    b = make_result().experiments[0]
    b.name, b.after.label = "another fix", "fixed another way"
    fig = plots.mfu(a, b, title="fixes")
    labels = [t.get_text() for t in fig.axes[0].get_xticklabels()]
    assert len(labels) == 3 and len(set(labels)) == 3, labels


def test_summary_beside_a_reference_names_a_different_host(tmp_path):
    import dataclasses
    from test_results import H100
    for folder, cpu in (("mine", "CPU A"), ("ref", "CPU B")):
        r = make_result("01_measuring")
        r.device = dataclasses.replace(H100, cpu=cpu)
        r.save(tmp_path / folder)
    md, _ = course.write_summary(tmp_path / "mine" / "nvidia-h100-80gb-hbm3", tmp_path / "out",
                                 compare=tmp_path / "ref" / "nvidia-h100-80gb-hbm3")
    assert "The host CPUs differ (CPU A here, CPU B in the reference)" in md.read_text()
    md, _ = course.write_summary(tmp_path / "ref" / "nvidia-h100-80gb-hbm3", tmp_path / "out2",
                                 compare=tmp_path / "ref" / "nvidia-h100-80gb-hbm3")
    assert "host CPUs differ" not in md.read_text()


def test_summary_beside_a_reference_gives_both_hosts_launch_speed(tmp_path):
    from gpulab.verdicts.results import NotebookResult
    from test_results import H100
    for folder, us in (("mine", 4.2), ("ref", 6.9)):
        r = NotebookResult("00_device", smoke=False, device=H100)
        r.record("host", {"cpu": "CPU", "cores": 16, "launch_us": us, "launch_us_rounds": [us]})
        r.save(tmp_path / folder)
        make_result("01_measuring").save(tmp_path / folder)
    md, _ = course.write_summary(tmp_path / "mine" / "nvidia-h100-80gb-hbm3", tmp_path / "out",
                                 compare=tmp_path / "ref" / "nvidia-h100-80gb-hbm3")
    assert "4.2 µs per eager kernel launch here, 6.9 µs in the reference" in md.read_text()
