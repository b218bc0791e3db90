"""The committed reference runs keep the promises of a verdict: what they decide, they decide clear of the band."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

REFERENCE = Path(__file__).resolve().parent.parent / "data" / "reference"
H100 = REFERENCE / "nvidia-h100-80gb-hbm3"


def claims(folder: Path) -> list[tuple[str, dict]]:
    return [(p.stem, c) for p in sorted(folder.glob("[0-9][0-9]_*.json"))
            for c in json.loads(p.read_text()).get("claims", [])]


@pytest.mark.parametrize("folder", sorted(p for p in REFERENCE.iterdir() if p.is_dir()), ids=lambda p: p.name)
def test_a_decided_claim_with_a_spread_does_not_touch_its_band(folder):
    """Confirmed or refuted on an interval of positive width: neither end of the band lies inside it (a count
    or definition, with no spread, may equal its band exactly)."""
    for nb, c in claims(folder):
        lo_hi = c.get("interval")
        if c["verdict"] in ("confirmed", "refuted") and lo_hi and lo_hi[1] > lo_hi[0]:
            for edge in (c.get("low"), c.get("high")):
                assert edge is None or not lo_hi[0] <= edge <= lo_hi[1], (nb, c["text"], lo_hi, edge)


def test_the_h100_reference_holds_every_notebook_of_one_gpu():
    names = {p.stem for p in H100.glob("[0-9][0-9]_*.json")}
    assert {f"{i:02d}" for i in range(10)} <= {n[:2] for n in names}
    for p in H100.glob("[0-9][0-9]_*.json"):
        data = json.loads(p.read_text())
        assert data["smoke"] is False and data["device"]["name"] == "NVIDIA H100 80GB HBM3", p.name


@pytest.mark.parametrize("folder", sorted(p for p in REFERENCE.iterdir() if p.is_dir()), ids=lambda p: p.name)
def test_a_reference_folder_comes_from_one_commit(folder):
    """Every single-GPU result (00-09, 11) in a reference folder records the same commit; notebook 10 runs on another
    machine (two GPUs) and may come from another."""
    commits = {p.name: json.loads(p.read_text()).get("commit") for p in sorted(folder.glob("[0-9][0-9]_*.json"))
               if not p.name.startswith("10_")}
    assert commits and len(set(commits.values())) == 1 and None not in commits.values(), commits


def test_the_repeat_run_is_of_the_h100_reference_commit():
    """The second H100 run, kept for the run-to-run agreement the README quotes, is of the reference's commit."""
    repeat = REFERENCE.parent / "repeats" / H100.name
    ref_commit = json.loads((H100 / "01_measuring.json").read_text())["commit"]
    for p in sorted(repeat.glob("[0-9][0-9]_*.json")):
        data = json.loads(p.read_text())
        assert data["commit"] == ref_commit and data["smoke"] is False, p.name


def test_the_second_h100_run_agrees_with_the_reference():
    """The course's bar for reproducible verdicts: the second run of the reference's commit gives the same verdict on
    at least 98% of the claims ("refuted higher" and "refuted lower" count as different), and no claim is
    confirmed in one run and refuted in the other."""
    from gpulab.app.summary import collect
    from gpulab.claims import agreement

    def by_notebook(folder: Path) -> dict[str, list[dict]]:
        return {nb: data.get("claims", []) for nb, data in collect(folder)[0].items()}

    r = agreement(by_notebook(H100), by_notebook(REFERENCE.parent / "repeats" / H100.name))
    assert r["claims"] >= 170 and r["share_same"] >= 0.98, r["changed"]
    assert not r["confirmed_vs_refuted"], r["confirmed_vs_refuted"]
