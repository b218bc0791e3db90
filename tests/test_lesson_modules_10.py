"""Notebook 10's math on CPU: bus bandwidth, the link table, overlap, intervals over rounds, implausible scaling,
and launching a worker file the notebook wrote."""
from __future__ import annotations

import pytest

from gpulab.tools import distributed as D
from gpulab.tools import links
from gpulab.lessons import multi_gpu as R


def test_bus_bandwidth_is_algbw_times_2_n_minus_1_over_n():
    assert links.bus_bandwidth_gbs(1e9, 1.0, 2) == pytest.approx(1.0)  # n=2: busbw = algbw
    assert links.bus_bandwidth_gbs(1e9, 1.0, 8) == pytest.approx(1.75)
    assert links.bus_bandwidth_gbs(4e9, 2.0, 4) == pytest.approx(2.0 * 1.5)
    assert links.bus_bandwidth_gbs(1e9, 1.0, 1) == 0.0
    with pytest.raises(ValueError, match="world_size"):
        links.bus_bandwidth_gbs(1e9, 1.0, 0)
    with pytest.raises(ValueError, match="seconds"):
        links.bus_bandwidth_gbs(1e9, 0.0, 2)


class FakeNVML:
    NVML_NVLINK_MAX_LINKS = 18
    NVML_FEATURE_ENABLED = 1

    def __init__(self, links=0, version=6, gen=5, width=16):
        self.links, self.version, self.gen, self.width = links, version, gen, width

    def nvmlInit(self):
        pass

    def nvmlDeviceGetHandleByIndex(self, i):
        return i

    def nvmlDeviceGetNvLinkState(self, h, link):
        if link >= self.links:
            raise RuntimeError("NotSupported")
        return 1

    def nvmlDeviceGetNvLinkVersion(self, h, link):
        return self.version

    def nvmlDeviceGetCurrPcieLinkGeneration(self, h):
        return 1  # an idle link trains down

    def nvmlDeviceGetMaxPcieLinkGeneration(self, h):
        return self.gen

    def nvmlDeviceGetCurrPcieLinkWidth(self, h):
        return self.width

    def nvmlDeviceGetMaxPcieLinkWidth(self, h):
        return self.width


def test_link_limit_nvlink4_h100_is_18_links_of_25_gbs():
    info = links.link_limit(0, nvml=FakeNVML(links=18, version=6))
    assert info.kind == "nvlink" and info.limit_gbs == pytest.approx(450.0) and "4.0" in info.detail


def test_link_limit_falls_back_to_pcie_and_to_none():
    info = links.link_limit(0, nvml=FakeNVML(links=0, gen=5, width=16))
    assert info.kind == "pcie" and info.limit_gbs == pytest.approx(16 * 3.938)
    assert links.link_limit(None).limit_gbs is None
    assert links.link_limit(0, nvml=FakeNVML(links=2, version=99)).limit_gbs is None  # unknown version: no guess


def test_overlap_fraction():
    assert R.overlap_fraction([(0, 10)], [(0, 5), (4, 8)]) == pytest.approx(0.8)
    assert R.overlap_fraction([(10, 20)], [(0, 5)]) == 0.0
    assert R.overlap_fraction([], [(0, 5)]) is None


def _rank(times):
    return {"world_size": 2, "sizes": [{"bytes": 2**30, "iters": 10, "times_s": times}]}


def test_allreduce_table_takes_the_slowest_rank_per_round():
    rows = R.allreduce_table([_rank([1.0, 2.0, 1.0]), _rank([2.0, 1.0, 1.0])])
    (row,) = rows
    assert row["time_us"] == pytest.approx(2e6)  # rounds: 2, 2, 1 -> median 2
    assert row["busbw_gbs"] == pytest.approx(2**30 / 2.0 / 1e9)
    assert row["busbw_low"] <= row["busbw_gbs"] <= row["busbw_high"]


def _train(world, step_s, tokens=100, mem=None):
    conf = {"label": "x", "step_s": step_s, "tokens_per_step": tokens, "flops_per_token": 1e9, "loss": 1.0,
            "peak_memory_gb": mem, "matmul_dtype": "bf16"}
    return [{"world_size": world, "configs": [conf]} for _ in range(world)]


def test_scaling_efficiency_and_its_interval():
    one = R.train_table(_train(1, [1.0, 1.0, 1.0]), peak_tflops=None)[0]
    two = R.train_table(_train(2, [1.1, 1.0, 1.2]), peak_tflops=100.0)[0]
    eff, lo, hi = R.scaling_efficiency(one, two)
    assert eff == pytest.approx(1 / 1.1) and lo <= eff <= hi
    assert two["mfu_per_gpu"] == pytest.approx(1e9 * 100 / 1.1 / 100e12)
    cmp = R.as_comparison("1 -> 2", one, two, peak_tflops=100.0, device="test")
    assert cmp.speedup == pytest.approx(2 / 1.1)


def test_implausible_scaling_is_flagged_and_kept_out_of_gains():
    # a 2-core CPU read 1 -> 2 processes as 8.60x: "scaling efficiency 430.2%"
    one = R.train_table(_train(1, [4.3, 4.3, 4.3]), peak_tflops=None)[0]
    two = R.train_table(_train(2, [1.0, 1.0, 1.0]), peak_tflops=None)[0]
    eff, lo, hi = R.scaling_efficiency(one, two)
    assert eff == pytest.approx(4.3) and two["tokens_per_s"] / one["tokens_per_s"] == pytest.approx(8.6)
    assert "over 100%" in R.plausible_scaling(lo, "nccl")
    assert "CPU processes" in R.plausible_scaling(0.5, "gloo")
    assert R.plausible_scaling(0.95, "nccl") is None
    cmp = R.as_comparison("1 -> 2", one, two, peak_tflops=None, device="cpu")
    assert cmp.kind == "demonstration"  # a contrast, never a gain to adopt


def test_every_claim_quotes_its_source():
    assert all(c.quote and c.source for c in R.CLAIMS)
    keys = [c.key for c in R.CLAIMS]
    assert len(keys) == len(set(keys)) and set(R.OTHER_SYSTEMS) <= set(keys)


def test_launch_resolves_a_worker_file(tmp_path):
    worker = tmp_path / "worker.py"
    worker.write_text("def answer(ctx, x=1):\n    return {'x': x}\n")
    name, fn = D.resolve_target(f"{worker}:answer")
    assert name == f"{worker.resolve()}:answer" and fn(None, x=3) == {"x": 3}
    with pytest.raises(ValueError, match="no such file"):
        D.resolve_target(f"{tmp_path / 'missing.py'}:answer")
    with pytest.raises(ValueError, match="must look like"):
        D.resolve_target("no_colon")


def test_bandwidth_axis_has_no_negative_decades_and_the_overlap_legend_sits_beside_the_lanes():
    import matplotlib

    matplotlib.use("Agg")
    from gpulab.lessons import multi_gpu as R

    rows = [{"bytes": 2**k, "busbw_gbs": v, "busbw_low": lo, "busbw_high": v * 1.1}
            for k, v, lo in ((10, 0.002, 0.0), (12, 0.01, 0.008), (20, 5.0, 4.0), (30, 300.0, 290.0))]
    ax = R.plot_bandwidth(rows, link_gbs=450.0).axes[0]
    assert ax.get_yscale() == "log" and ax.get_ylim()[0] > 0
    assert ax.get_xlim()[0] >= 2**10 / 2 and [t.get_text() for t in ax.get_xticklabels()][0] == "1 KiB"
    profiles = [{"compute": [(0.0, 5.0)], "comm": [(3.0, 6.0)]}, {"compute": [(0.0, 5.0)], "comm": [(4.0, 7.0)]}]
    fig = R.plot_overlap(profiles)
    fig.canvas.draw()
    leg, ax = fig.axes[0].get_legend().get_window_extent(), fig.axes[0].get_window_extent()
    assert leg.x0 >= ax.x1  # beside the lanes, not over them
