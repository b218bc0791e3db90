"""The host's launch time: timed by each lesson at its start and save, and said wherever two runs are compared."""
import json

import pytest

import gpulab as gl
from gpulab.measuring.host import launch_range_us, launch_times_us, speed_difference


def rounds_last(monkeypatch, round_s: float) -> None:
    """gpulab.host's clock, reading `round_s` later at every call: each round of launches lasts `round_s`, whatever
    the machine's load."""
    import itertools
    import types

    from gpulab import host

    ticks = itertools.count(0.0, round_s)
    monkeypatch.setattr(host, "time", types.SimpleNamespace(perf_counter=lambda: next(ticks)))


def test_launch_times_name_a_bad_argument(cpu_device, monkeypatch):
    with pytest.raises(ValueError, match="launches=0"):
        launch_times_us(cpu_device, launches=0)
    with pytest.raises(ValueError, match="rounds=0"):
        launch_times_us(cpu_device, rounds=0)
    rounds_last(monkeypatch, 0.5)
    times = launch_times_us(cpu_device, launches=50, rounds=2)
    assert times == pytest.approx([1e4, 1e4])  # 0.5 s over 50 launches: µs per op, not the round's seconds


def test_a_lesson_records_its_host_speed_at_start_and_save(cpu_device, tmp_path, monkeypatch):
    monkeypatch.setenv("GPULAB_RESULTS", str(tmp_path))
    les = gl.lesson("my_notebook", {}, full=dict(N=2), device=cpu_device, show=False)
    host = les.result.extra["host"]
    assert host["launch_us"] > 0 and len(host["launch_us_rounds"]) == 3 and "launch_us_end" not in host
    assert "µs per eager op" in les._repr_html_()  # a CPU has no kernel launch to name
    data = json.loads(les.save().read_text())
    assert data["extra"]["host"]["launch_us_end"] > 0 and data["extra"]["host"]["cores"] == cpu_device.cpu_cores


def test_speed_difference_says_which_host_was_slower_and_only_beyond_drift():
    fast, slow = {"launch_us": 6.2, "launch_us_end": 6.3}, {"launch_us": 8.7, "launch_us_end": 8.9}
    assert speed_difference(slow, fast).endswith("this host was 1.4x slower, so launch-bound work ran slower here")
    assert "8.7-8.9 µs per kernel launch here, 6.2-6.3 µs in the reference" in speed_difference(slow, fast)
    assert "1.4x faster" in speed_difference(fast, slow)
    assert speed_difference(fast, {"launch_us": 6.5}).endswith("about the same speed")
    assert speed_difference(fast, None) is None and speed_difference({}, fast) is None  # files from before it
    assert launch_range_us({"launch_us": 7.0}) == (7.0, 7.0) and launch_range_us({"cpu": "x"}) is None


def _result(launch_us, verdict):
    return {"notebook": "06_batch_size", "smoke": False, "experiments": [], "device": {"name": "GPU"},
            "claims": [{"key": "06.speed_8_64", "text": "4x", "verdict": verdict, "measured": 4.0, "low": 3,
                        "high": 5}],
            "extra": {"host": {"launch_us": launch_us}} if launch_us else {}}


def test_the_summary_gives_the_host_speed_where_verdicts_differ():
    from gpulab.app.summary import agreement_section

    text = agreement_section({"06_batch_size": _result(8.7, "inconclusive")},
                             {"06_batch_size": _result(6.2, "confirmed")})
    assert "- 06_batch_size: host 8.7 µs per kernel launch here, 6.2 µs in the reference: this host was 1.4x slower" in text
    same = agreement_section({"06_batch_size": _result(8.7, "confirmed")}, {"06_batch_size": _result(6.2, "confirmed")})
    assert "host" not in same  # nothing differs, nothing to explain
    old = agreement_section({"06_batch_size": _result(8.7, "inconclusive")}, {"06_batch_size": _result(None, "confirmed")})
    assert "host" not in old  # a reference written before the host was timed


def test_the_reference_view_gives_both_hosts_speeds():
    from gpulab.verdicts.results import ReferenceView

    html = ReferenceView(_result(8.7, "inconclusive"), _result(6.2, "confirmed"))._repr_html_()
    assert "Host 8.7 µs per kernel launch here, 6.2 µs in the reference: this host was 1.4x slower" in html


def test_a_gpu_described_on_a_machine_without_cuda_records_no_host_speed(monkeypatch, tmp_path):
    """Tests describe an H100 on a CPU-only machine to reach the GPU code paths: the lesson must not launch on it."""
    import torch
    from gpulab.measuring.device import DeviceInfo
    from gpulab.measuring.host import host_speed

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    h100 = DeviceInfo(kind="cuda", name="NVIDIA H100 80GB HBM3", capability=(9, 0))
    assert host_speed(h100) is None
    monkeypatch.setenv("GPULAB_RESULTS", str(tmp_path))
    les = gl.lesson("my_notebook", {}, full=dict(N=2), device=h100, show=False)
    assert "host" not in les.result.extra and "µs per" not in les._repr_html_()
    assert "host" not in json.loads(les.save().read_text())["extra"]


def _topology(root, siblings):
    for cpu, sib in enumerate(siblings):
        d = root / f"cpu{cpu}" / "topology"
        d.mkdir(parents=True)
        (d / "thread_siblings_list").write_text(sib + "\n")
    return root


def test_physical_cores_count_two_threads_of_one_core_once(tmp_path, monkeypatch):
    from gpulab.measuring.device import physical_cores
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {0, 1, 2, 3}, raising=False)
    assert physical_cores(_topology(tmp_path / "ht", ["0,2", "1,3", "0,2", "1,3"])) == 2
    assert physical_cores(_topology(tmp_path / "noht", ["0", "1", "2", "3"])) == 4
    assert physical_cores(tmp_path / "missing") is None  # no topology exposed: unknown, not a guess


def test_the_recorded_host_names_its_physical_cores(cpu_device, tmp_path, monkeypatch):
    from gpulab.measuring.host import host_speed
    monkeypatch.setattr("gpulab.measuring.host.physical_cores", lambda: 8)
    host = host_speed(cpu_device, launches=10, rounds=1)
    assert host["physical_cores"] == 8 and host["cores"] == cpu_device.cpu_cores
