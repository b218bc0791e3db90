"""Notebook 08's display helpers: the waterfall's rows and the params it records."""
from types import SimpleNamespace

from gpulab.lessons import case_study_lesson as L


def _step(tps):
    return SimpleNamespace(tokens_per_s=tps, row=lambda: {"tokens_per_s": tps})


def test_waterfall_rows_gain_and_cumulative():
    rows = L.waterfall_rows([_step(100.0), _step(200.0), _step(300.0)])
    assert [r["step"] for r in rows] == [0, 1, 2]
    assert rows[0]["gain"] is None and rows[1]["gain"] == 2.0 and rows[2]["gain"] == 1.5
    assert rows[2]["cumulative"] == 3.0


def test_params_record_the_sizes_used():
    ns = {k: 1 for k in ("ROUNDS", "N_LAYER", "N_HEAD", "N_EMBD", "SEQ_LEN", "VOCAB_SIZE", "NAIVE_BATCH", "BATCH_SIZE",
                         "GRAD_ACCUM", "WORKERS", "STEP_SECONDS", "LOSS_STEPS", "CORPUS_BYTES", "COMPILE_MODE",
                         "FUSED_LOSS", "BF16_WEIGHTS")} | L.SMOKE_SIZES
    p = L.params(ns, do_compile=False)
    assert p["n_layer"] == L.SMOKE_SIZES["N_LAYER"] and p["compile"] is False and "naive_batch" in p


def test_the_parameters_cell_trains_the_shape_notebook_09_profiles():
    from _notebook_run import parameters_cell

    p = parameters_cell("08_case_study")
    shape = {"n_layer": p["N_LAYER"], "n_head": p["N_HEAD"], "n_embd": p["N_EMBD"], "block_size": p["SEQ_LEN"],
             "vocab_size": p["VOCAB_SIZE"]}
    assert shape == L.MODEL_SHAPE and L.MODEL_SHAPE["n_embd"] // L.MODEL_SHAPE["n_head"] == 128
    assert (p["BATCH_SIZE"], p["GRAD_ACCUM"], p["WORKERS"]) == tuple(L.FINAL_BATCH.values())
