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
    from _notebook_jobs import JOBS

    monkeypatch.setattr(JOBS, "get", lambda run: unmarked(run.name))


@pytest.fixture
def cpu_device():
    """The CPU as gpulab describes it, for tests of the CPU path that must not pick up a GPU where one exists."""
    from gpulab.measuring.device import DeviceInfo

    return DeviceInfo(kind="cpu", name="CPU")


# A reader's -p value on top of SMOKE=True, carried by the shared smoke run: it must win over the smoke size and be
# recorded as given (tests/test_fusion.py checks it). 8 is not 03's smoke TRAIN_BATCH (4).
SMOKE_OVERRIDES: dict = {"03_fusion": {"TRAIN_BATCH": 8}}


def pytest_collection_finish(session):
    """Start the notebook runs the selected tests will need, in the background, in the order they need them."""
    from _notebook_jobs import JOBS, planned_runs

    for run in planned_runs(session.items, SMOKE_OVERRIDES):
        JOBS.submit(run)


def pytest_sessionfinish(session, exitstatus):
    from _notebook_jobs import JOBS

    JOBS.shutdown()


@pytest.fixture(scope="session")
def smoke_run():
    """A notebook's smoke run, once per test session; returns (result JSON, executed notebook).

    Every test that asserts on a notebook's output shares this one run, so CI runs each notebook once; the runs
    start in the background when the session begins (tests/_notebook_jobs.py).
    """
    from _notebook_jobs import smoke

    def run(name: str) -> tuple[dict, dict]:
        pytest.importorskip("papermill")
        return smoke(name, SMOKE_OVERRIDES).result()
    return run
