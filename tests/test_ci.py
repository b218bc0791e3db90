"""CI's script: a fresh environment of its own each time, removed after, and a run that tested nothing fails."""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# A stand-in for python3: `-m venv DIR` makes DIR/bin/python, which records its arguments and, for pytest, exits
# with $PYTEST_EXIT (5: no tests collected).
FAKE_PYTHON3 = """#!/usr/bin/env bash
if [ "$1 $2" = "-m venv" ]; then
    mkdir -p "$3/bin"
    printf 'export PATH="%s/bin:$PATH"\\n' "$3" > "$3/bin/activate"
    printf '#!/usr/bin/env bash\\necho "$*" >> "%s"\\n[ "$2" = pytest ] && exit "$PYTEST_EXIT"\\nexit 0\\n' \\
        "$CALLS" > "$3/bin/python"
    chmod +x "$3/bin/python"
    echo "$3" >> "$VENVS"
fi
"""


def _ci(tmp_path, pytest_exit, **env):
    if shutil.which("bash") is None:
        pytest.skip("no bash")
    stub = tmp_path / "stub"
    stub.mkdir(exist_ok=True)
    (stub / "python3").write_text(FAKE_PYTHON3)
    (stub / "python3").chmod(0o755)
    env = {"PATH": f"{stub}:{os.environ['PATH']}", "TMPDIR": str(tmp_path), "CALLS": str(tmp_path / "calls"),
           "VENVS": str(tmp_path / "venvs"), "PYTEST_EXIT": str(pytest_exit), "HOME": str(tmp_path), **env}
    proc = subprocess.run(["bash", str(ROOT / ".ci" / "run")], env=env, capture_output=True, text=True, timeout=60)
    venvs = (tmp_path / "venvs").read_text().split()
    return proc, venvs, (tmp_path / "calls").read_text()


def test_ci_makes_a_fresh_venv_of_its_own_and_removes_it(tmp_path):
    proc, venvs, calls = _ci(tmp_path, 0)
    assert proc.returncode == 0, proc.stderr
    assert len(venvs) == 1 and Path(venvs[0]).parent == tmp_path and "gpulab-ci-venv." in venvs[0]
    assert not Path(venvs[0]).exists()  # removed at exit
    assert "-m pytest -q" in calls and "install -r requirements.txt" in calls
    again, venvs2, _ = _ci(tmp_path, 0)
    assert venvs2[-1] != venvs[0]  # a new one each run: two runs never share (or delete) one folder


def test_ci_fails_loudly_when_pytest_collects_nothing(tmp_path):
    proc, _, _ = _ci(tmp_path, 5)
    assert proc.returncode == 5 and "collected no tests" in proc.stderr


def test_ci_venv_names_the_folder_to_use(tmp_path):
    mine = tmp_path / "my-venv"
    proc, venvs, _ = _ci(tmp_path, 1, CI_VENV=str(mine))
    assert proc.returncode == 1 and venvs == [str(mine)] and mine.exists()  # the caller's folder is kept
