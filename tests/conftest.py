import pytest


@pytest.fixture(autouse=True)
def _isolated_results(tmp_path, monkeypatch):
    """No test writes into the repository's data/results."""
    monkeypatch.setenv("GPULAB_RESULTS", str(tmp_path / "results"))


@pytest.fixture
def cpu_device():
    """The CPU as gpulab describes it, for tests of the CPU path that must not pick up a GPU where one exists."""
    from gpulab.device import DeviceInfo

    return DeviceInfo(kind="cpu", name="CPU")
