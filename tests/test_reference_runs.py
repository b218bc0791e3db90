"""The committed reference runs keep the promises of a verdict: what they decide, they decide clear of the band."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

REFERENCE = Path(__file__).resolve().parent.parent / "data" / "reference"
H200 = REFERENCE / "nvidia-h200"


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


def test_the_h200_reference_holds_every_notebook_of_one_gpu():
    names = {p.stem for p in H200.glob("[0-9][0-9]_*.json")}
    assert {f"{i:02d}" for i in range(10)} <= {n[:2] for n in names}
    for p in H200.glob("[0-9][0-9]_*.json"):
        data = json.loads(p.read_text())
        assert data["smoke"] is False and data["device"]["name"] == "NVIDIA H200", p.name


def test_the_reference_gpu_is_the_h200():
    """One reference GPU: the pages, the summary's default and the README all read the H200's folder."""
    from gpulab.verdicts.results import REFERENCE_SLUG, reference_dir

    assert REFERENCE_SLUG == H200.name and reference_dir() == H200 and H200.is_dir()


@pytest.mark.parametrize("folder", sorted(p for p in REFERENCE.iterdir() if p.is_dir()), ids=lambda p: p.name)
def test_a_reference_folder_comes_from_one_commit(folder):
    """Every single-GPU result (00-09, 11) in a reference folder records the same commit; notebook 10 runs on another
    machine (two GPUs) and may come from another."""
    commits = {p.name: json.loads(p.read_text()).get("commit") for p in sorted(folder.glob("[0-9][0-9]_*.json"))
               if not p.name.startswith("10_")}
    assert commits and len(set(commits.values())) == 1 and None not in commits.values(), commits


def _tracked_bytes(folder: Path) -> int:
    """Bytes of the files git tracks under `folder` (every file there where git is missing: a copy, not a clone)."""
    import subprocess

    try:
        out = subprocess.run(["git", "ls-files", "-z", str(folder)], cwd=folder.parent, capture_output=True,
                             check=True, timeout=30).stdout
        files = [folder.parent / f for f in out.decode().split("\0") if f]
    except (OSError, subprocess.SubprocessError):
        files = []
    if not files:
        files = [p for p in folder.rglob("*") if p.is_file() and "results" not in p.relative_to(folder).parts[:1]]
    return sum(p.stat().st_size for p in files if p.exists())


def test_the_clone_stays_light():
    """data/ in the working tree stays under 25 MB: one run per GPU, compressed figures, no earlier runs."""
    data = REFERENCE.parent
    assert _tracked_bytes(data) <= 25e6, f"data/ holds {_tracked_bytes(data) / 1e6:.1f} MB (at most 25)"
    assert not (data / "repeats").exists(), "earlier runs live in git history, not in data/repeats"
