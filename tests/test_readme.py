"""The README's two commands are the front door: CI must run exactly the documented test command."""
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _commands():
    return re.findall(r"```bash\n(.+?)\n```", (ROOT / "README.md").read_text())


def test_ci_runs_the_readme_test_command():
    test_cmd = next(c for c in _commands() if "pytest" in c)
    assert test_cmd in (ROOT / ".ci" / "run").read_text()


def test_readme_course_command_uses_the_runner():
    assert any("python -m gpulab run" in c and "requirements.txt" in c for c in _commands())


def test_requirements_name_every_package_with_lower_bounds_only():
    reqs = (ROOT / "requirements.txt").read_text()
    for pkg in ("torch", "jupyterlab", "matplotlib", "ipywidgets", "nvidia-ml-py", "papermill", "pytest"):
        assert re.search(rf"^{pkg}>=", reqs, re.M), pkg
    assert "==" not in reqs and "\npynvml" not in reqs
