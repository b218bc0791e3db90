import json

from _notebook_jobs import live_children
import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from gpulab.tools.dataloading import CUDAPrefetcher, DataLoaderTuning, sweep_workers, tune_dataloader
from gpulab.workloads.models import SyntheticImageDataset


def _step(x, y):
    return (x.float().mean() + y.float().mean()).item()


def test_prefetcher_on_cpu_yields_the_loaders_batches():
    ds = TensorDataset(torch.randn(20, 3), torch.arange(20))
    loader = DataLoader(ds, batch_size=6)
    got = list(CUDAPrefetcher(loader, "cpu"))
    want = list(loader)
    assert len(got) == len(want) == len(CUDAPrefetcher(loader, "cpu")) == 4
    for (gx, gy), (wx, wy) in zip(got, want):
        assert torch.equal(gx, wx) and torch.equal(gy, wy)


def test_tune_dataloader_sweeps_and_picks_the_fastest(tmp_path):
    ds = SyntheticImageDataset(tmp_path, n_images=16, size=16)
    res = tune_dataloader(ds, _step, batch_size=4, device="cpu", workers=[0, 1], prefetch_factor=2,
                          persistent_workers=(False, True), batches=3, warmup_batches=1, progress=False)
    # workers=0: one row (pin_memory=True skipped on CPU); workers=1: prefetch 2 x persistent False/True
    assert [(r["num_workers"], r["persistent_workers"]) for r in res.rows] == [(0, False), (1, False), (1, True)]
    assert all(r["samples_per_s"] > 0 and r["batches"] == 3 and r["pin_memory"] is False for r in res.rows)
    assert res.best == max(res.rows, key=lambda r: r["samples_per_s"])
    assert any("pin_memory" in n for n in res.notes)
    kw = res.best_loader_kwargs()
    assert kw["batch_size"] == 4 and len(DataLoader(ds, **kw)) == 4
    assert "<table" in res._repr_html_() and "DataLoaderTuning" in repr(res)
    back = DataLoaderTuning.from_dict(json.loads(json.dumps(res.to_dict())))
    assert back == res
    assert live_children() == []  # workers were shut down


@pytest.mark.parametrize("kwargs, name", [
    (dict(batch_size=0), "batch_size"), (dict(batch_size=4, workers=[0, -1]), "workers"),
    (dict(batch_size=4, prefetch_factor=0), "prefetch_factor"), (dict(batch_size=4, batches=0), "batches")])
def test_tune_dataloader_rejects_bad_input_before_any_work(kwargs, name):
    calls = []
    with pytest.raises(ValueError, match=name):
        tune_dataloader(TensorDataset(torch.randn(8, 2), torch.arange(8)), lambda x, y: calls.append(1),
                        progress=False, **kwargs)
    assert calls == []


def test_default_workers():
    assert sweep_workers(1, 20) == [0, 1]
    assert sweep_workers(6, 20) == [0, 1, 3, 6]
    assert sweep_workers(16, 20) == [0, 1, 8, 16]


def test_image_dataset_works_in_spawned_workers(tmp_path):
    # Under spawn/forkserver the dataset is pickled into each worker: it must live in an importable module.
    ds = SyntheticImageDataset(tmp_path, n_images=8, size=16)
    loader = DataLoader(ds, batch_size=4, num_workers=1, multiprocessing_context="spawn")
    xs = [x for x, _ in loader]
    assert len(xs) == 2 and xs[0].shape == (4, 3, 16, 16)


def test_tune_dataloader_defaults_scale_to_a_small_dataset(monkeypatch):
    """A 64-sample dataset ran 9 settings of 20 batches (223 s) with the old defaults."""
    import gpulab.tools.dataloading as dl

    monkeypatch.setattr(dl, "usable_cores", lambda: 2)
    calls = []
    ds = TensorDataset(torch.randn(64, 3), torch.arange(64))
    res = tune_dataloader(ds, lambda x, y: calls.append(len(x)), batch_size=4, device="cpu", progress=False)
    assert [r["num_workers"] for r in res.rows] == [0, 1, 2]  # 3 settings: pin_memory is CUDA's
    assert all(r["batches"] == 16 for r in res.rows)  # one pass over the 64 samples
    assert all(r["persistent_workers"] for r in res.rows if r["num_workers"]) and len(calls) == 3 * (2 + 16)
    assert dl.sweep_workers(16, 20) == [0, 1, 8, 16] and dl.sweep_workers(16, 3) == [0, 1]
    assert dl.sweep_workers(1, 20) == [0, 1]
    tiny = tune_dataloader(TensorDataset(torch.randn(8, 3), torch.arange(8)), lambda x, y: None, batch_size=4,
                           device="cpu", workers=[0], progress=False)
    assert tiny.rows[0]["batches"] == 2  # at least 2 batches, drawn again from the 8 samples
