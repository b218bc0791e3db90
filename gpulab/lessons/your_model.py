"""Notebook 11's own helpers: whose result file a run writes, and which sizes its banner names."""
from __future__ import annotations

import re
from typing import Any

NOTEBOOK = "11_your_model"
COURSE_MODELS = {"TinyLM": ("BATCH", "WIDTH", "DEPTH", "SEQ_LEN", "VOCAB"),
                 "SmallCNN": ("BATCH", "WIDTH", "DEPTH", "IMAGE_SIZE")}  # the two models the notebook ships


def is_course_model(model: Any) -> bool:
    """Whether `model` is one of the notebook's own two (defined in the notebook, not imported from elsewhere)."""
    cls = type(model)
    return cls.__name__ in COURSE_MODELS and cls.__module__ == "__main__"


def result_stem(model: Any, run_name: str | None = None) -> str:
    """The stem of the run's result files: RUN_NAME's when given; the course's file only for the course's models;
    a reader's model gets its class name, so that it never overwrites the course's 11_your_model.json."""
    if run_name:
        return f"{NOTEBOOK}-{run_name}"
    if is_course_model(model):
        return NOTEBOOK
    name = re.sub(r"[^A-Za-z0-9_-]+", "-", type(model).__name__).strip("-")[:40] or "model"
    return f"{NOTEBOOK}-{name}"


def model_sizes(model: Any, batch: int, inputs: Any, params: dict[str, Any]) -> dict[str, Any]:
    """The sizes of the model that runs: a course model's parameters, or a reader's class, size and input shape."""
    if is_course_model(model):
        return {k: params[k] for k in COURSE_MODELS[type(model).__name__]}
    return {"model": type(model).__name__, "parameters": sum(p.numel() for p in model.parameters()), "BATCH": batch,
            "inputs": tuple(getattr(inputs, "shape", ()))}
