import pytest


@pytest.fixture(autouse=True)
def _isolated_results(tmp_path, monkeypatch):
    """No test writes into the repository's data/results."""
    monkeypatch.setenv("GPULAB_RESULTS", str(tmp_path / "results"))
