"""A comparison renamed since the reference run still finds the reference's bars: 03's printed "n/a" once its
experiments and labels carried torch.compile's mode and the reference's did not."""
import copy

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from gpulab.display import plots  # noqa: E402
from gpulab.verdicts.results import named  # noqa: E402
from test_results import make_result  # noqa: E402


def test_named_finds_the_name_before_and_after_the_mode_joined_it():
    old = {"GPT training step: eager vs torch.compile": 1, "torch.compile": 2, "F.gelu": 3}
    assert named(old, "GPT training step: eager vs torch.compile (mode=default)") == 1
    assert named(old, "torch.compile (mode=default)") == 2 and named(old, "F.gelu") == 3
    new = {"torch.compile (mode=default)": 4}
    assert named(new, "torch.compile") == 4 and named(new, "torch.compile (mode=default)") == 4
    assert named(new, "torch.compile (mode=max-autotune)") is None  # another mode is another measurement


def test_mfu_and_speedup_bars_of_a_renamed_comparison_show_the_reference():
    mine = make_result(speedup=2.0).to_dict()["experiments"][0]
    mine["name"] = "GPT training step: eager vs torch.compile (mode=default)"
    ref = copy.deepcopy(mine)
    ref["name"] = "GPT training step: eager vs torch.compile"
    fig = plots.speedups(mine, reference=[ref])
    labels = [t.get_text() for t in fig.axes[0].texts]
    assert "n/a" not in labels
    fig = plots.mfu(mine, reference=[ref])
    assert "n/a" not in [t.get_text() for t in fig.axes[0].texts]
    plt.close("all")


def test_the_reference_view_sets_a_renamed_comparison_on_one_row():
    from gpulab.verdicts.results import ReferenceView

    mine = make_result(speedup=2.0).to_dict()
    ref = copy.deepcopy(mine)
    mine["experiments"][0]["name"] = "GELU: eager vs torch.compile (mode=default)"
    ref["experiments"][0].update(name="GELU: eager vs torch.compile", verdict="1.5x faster")
    rows = [r for r in ReferenceView(mine, ref).rows() if not r[0].startswith("claim:")]
    assert rows == [("GELU: eager vs torch.compile (mode=default)", mine["experiments"][0]["verdict"], "1.5x faster")]
    ref["experiments"][0]["name"] = "something else"
    rows = [r for r in ReferenceView(mine, ref).rows() if not r[0].startswith("claim:")]
    assert [r[0] for r in rows] == ["GELU: eager vs torch.compile (mode=default)", "something else"]
