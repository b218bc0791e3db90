import pytest


def pytest_collection_modifyitems(config, items):
    """A test that shares a notebook's smoke run runs that notebook: it is a `notebook` test, marked or not, so
    `pytest -m "not notebook"` is a quick check of gpulab alone."""
    for item in items:
        if "smoke_run" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.notebook)


@pytest.fixture(autouse=True)
def _isolated_results(tmp_path, monkeypatch):
    """No test writes into the repository's data/results."""
    monkeypatch.setenv("GPULAB_RESULTS", str(tmp_path / "results"))


@pytest.fixture(autouse=True)
def _notebooks_only_in_notebook_tests(request, monkeypatch):
    """A test that runs a real notebook through papermill without the `notebook` mark fails, naming the mark:
    the quick check stays quick. Tests that fake papermill replace this stand-in with their own."""
    if request.node.get_closest_marker("notebook"):
        return
    try:
        import papermill
    except ImportError:
        return

    def unmarked(src, *args, **kwargs):
        pytest.fail(f"{request.node.nodeid} runs {src} through papermill: mark it @pytest.mark.notebook")

    monkeypatch.setattr(papermill, "execute_notebook", unmarked)


@pytest.fixture
def cpu_device():
    """The CPU as gpulab describes it, for tests of the CPU path that must not pick up a GPU where one exists."""
    from gpulab.device import DeviceInfo

    return DeviceInfo(kind="cpu", name="CPU")


_SMOKE_RUNS: dict = {}
# A reader's -p value on top of SMOKE=True, carried by the shared smoke run: it must win over the smoke size and be
# recorded as given (tests/test_fusion.py checks it). 8 is not 03's smoke TRAIN_BATCH (4).
SMOKE_OVERRIDES: dict = {"03_fusion": {"TRAIN_BATCH": 8}}


@pytest.fixture(scope="session")
def smoke_run(tmp_path_factory):
    """Run a notebook once per test session in smoke mode; returns (result JSON, executed notebook).

    Every test that asserts on a notebook's output shares this one run, so CI runs each notebook once.
    """
    import json
    from pathlib import Path

    from gpulab.results import load_result

    notebooks = Path(__file__).resolve().parent.parent / "notebooks"

    def run(name: str) -> tuple[dict, dict]:
        if name not in _SMOKE_RUNS:
            papermill = pytest.importorskip("papermill")
            tmp = tmp_path_factory.mktemp(name)
            out = tmp / f"{name}.ipynb"
            mp = pytest.MonkeyPatch()
            mp.setenv("GPULAB_RESULTS", str(tmp / "results"))
            try:
                papermill.execute_notebook(str(notebooks / f"{name}.ipynb"), str(out),
                                           parameters={"SMOKE": True, **SMOKE_OVERRIDES.get(name, {})},
                                           kernel_name="python3", cwd=str(notebooks), progress_bar=False)
            finally:
                mp.undo()
            files = list((tmp / "results").glob(f"*/{name}.json"))
            assert len(files) == 1, f"{name} wrote no result JSON under {tmp / 'results'}"
            _SMOKE_RUNS[name] = (load_result(files[0]), json.loads(out.read_text()))
        return _SMOKE_RUNS[name]
    return run
