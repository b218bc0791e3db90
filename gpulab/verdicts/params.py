"""Each notebook's parameters, their types and ranges: checked by the runner before papermill starts, and by
the notebook itself (`gl.check_params(globals(), "02_tensor_cores")` right after its parameters cell), so a
papermill user, a `gpulab run -p` user and a Jupyter user get the same clear error.

Papermill's own `-p` turns "false" into the string "false" (truthy) and only logs a name the notebook does
not have; here both are errors that name the parameter and what it accepts.
"""
from __future__ import annotations

import ast
import difflib
import math
from dataclasses import dataclass, replace
from typing import Any, Callable, Iterable, Mapping

from ..measuring import checks


_SAME = object()  # "the smoke size is the full size"


@dataclass(frozen=True)
class Param:
    """One notebook parameter: a checker, a short description of what it accepts, and its sizes.

    The one size convention of the course: a parameter left at None in the notebook's parameters cell takes
    `default` (the full size) on a CUDA GPU and `smoke` at smoke scale (SMOKE=True or no GPU); any other value,
    from an edited cell or `-p NAME VALUE`, is the reader's and always wins. `gl.lesson` applies it.
    """

    check: Callable[[str, Any], Any]
    accepts: str
    default: Any = None
    smoke: Any = _SAME

    def __call__(self, name: str, value: Any) -> Any:
        return self.check(name, value)

    def sized(self, default: Any, smoke: Any = _SAME) -> Param:
        """This parameter with a full-size default and, where it differs, a smoke size."""
        return replace(self, default=default, smoke=smoke)

    def size_for(self, small: bool) -> Any:
        """The value a None takes: the smoke size at smoke scale, else the full-size default."""
        return self.smoke if small and self.smoke is not _SAME else self.default

    @property
    def has_default(self) -> bool:
        return self.default is not None or self.smoke is not _SAME


def _bool(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        hint = f" (Python spells it {value.capitalize()})" if str(value).lower() in ("true", "false") else ""
        raise ValueError(f"{name}={value!r} must be True or False{hint}")
    return value


def boolean() -> Param:
    return Param(_bool, "True or False")


# Every number a notebook takes has an upper bound too, checked before any work: a value past it would overflow
# (an int32 index, a timer's arithmetic) or run for days, and fail minutes in rather than at once.
MAX_INT = 2**31 - 1  # sizes, counts and bytes: past an int32 no size here fits in memory and no count finishes
MAX_SECONDS = 3600.0  # a timed window, a budget or a timeout: an hour is far past any measurement here
MAX_WORKERS = 256  # processes of a DataLoader or a launch: more than any host here has cores


def _int_in(name: str, value: Any, low: int, high: int, optional: bool) -> int | None:
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ValueError(f"{name}={value!r} must be an int >= {low} and <= {high}" + (" (or None)" if optional else ""))
    return value


def _number_in(name: str, value: Any, high: float, optional: bool) -> float | None:
    if value is None and optional:
        return None
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or not 0 < value <= high:
        raise ValueError(f"{name}={value!r} must be a finite number > 0 and <= {high:g}"
                         + (" (or None)" if optional else ""))
    return float(value)


def integer(minimum: int = 1, maximum: int = MAX_INT, *, optional: bool = False) -> Param:
    return Param(lambda n, v: _int_in(n, v, minimum, maximum, optional),
                 f"an int from {minimum} to {maximum}" + (" or None" if optional else ""))


def number(*, maximum: float = MAX_SECONDS, optional: bool = False) -> Param:
    return Param(lambda n, v: _number_in(n, v, maximum, optional),
                 f"a number > 0 and <= {maximum:g}" + (" or None" if optional else ""))


def one_of(*allowed: Any) -> Param:
    return Param(lambda n, v: checks.choice(n, v, allowed), "one of " + ", ".join(map(repr, allowed)))


def list_of(item: Param, *, optional: bool = False) -> Param:
    return Param(lambda n, v: checks.sequence_of(n, v, item, allow_none=optional),
                 f"a list of {item.accepts}" + (" or None" if optional else ""))


GPT_KEYS = ("vocab_size", "n_layer", "n_head", "n_embd", "block_size")


def _int_dict(name: str, value: Any, keys: tuple[str, ...]) -> dict:
    if not isinstance(value, dict) or set(value) != set(keys):
        raise ValueError(f"{name}={value!r} must be a dict with exactly the keys {', '.join(keys)}")
    for k in keys:
        _int_in(f"{name}[{k!r}]", value[k], 1, MAX_INT, False)
    return value


def _bursts(name: str, value: Any) -> list | None:
    if value is None:
        return None
    return checks.sequence_of(name, value, lambda n, pair: _pair(n, pair))


def _pair(name: str, pair: Any) -> tuple:
    if isinstance(pair, (str, bytes)) or not isinstance(pair, (list, tuple)) or len(pair) != 2:
        raise ValueError(f"{name}={pair!r} must be a pair (burst ms, idle gap ms)")
    return tuple(_number_in(f"{name}[{i}]", v, MAX_SECONDS * 1e3, False) for i, v in enumerate(pair))  # ms


def bursts() -> Param:
    return Param(_bursts, "a list of (burst ms, idle gap ms) pairs or None")


def optional_bool() -> Param:
    return Param(lambda n, v: v if v is None else _bool(n, v), "True, False or None")


def gpt_dict(*, optional: bool = False) -> Param:
    return Param(lambda n, v: v if optional and v is None else _int_dict(n, v, GPT_KEYS),
                 "a dict of ints: " + ", ".join(GPT_KEYS) + (" or None" if optional else ""))


def _run_name(name: str, value: Any) -> str | None:
    import re

    if value is not None and (not isinstance(value, str) or not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_-]{0,39}", value)):
        raise ValueError(f"{name}={value!r} must be None or a short name for the result files: 1-40 letters, digits, "
                         "- and _, starting with a letter or digit (e.g. 'resnet18')")
    return value


MATMUL_DTYPES = ("fp32", "tf32", "bf16", "fp16", "fp8")
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
_int, _opt_int, _sec, _opt_sec = integer(), integer(optional=True), number(), number(optional=True)

SCHEMAS: dict[str, dict[str, Param]] = {
    "01_measuring": dict(SMOKE=boolean(), BIG_N=_opt_int.sized(4096, smoke=64), TINY_SIZE=_opt_int.sized(128, smoke=16),
                         TIMING_N=_opt_int.sized(8192, smoke=256), GPT_LAYERS=_opt_int.sized(12, smoke=2),
                         GPT_WIDTH=_opt_int.sized(768, smoke=64), GPT_HEADS=_opt_int.sized(12, smoke=2),
                         GPT_SEQ=_opt_int.sized(1024, smoke=64), GPT_BATCH=_opt_int.sized(8, smoke=4),
                         MIN_TIME_S=_opt_sec.sized(1.0, smoke=0.05), OPT_BATCH=_opt_int.sized(32, smoke=4),
                         OPT_GRAD_ACCUM=_opt_int.sized(2), OPT_WORKERS=integer(0, MAX_WORKERS, optional=True).sized(4, smoke=1),
                         OPT_COMPILE=optional_bool().sized(True, smoke=False), OPT_SECONDS=_opt_sec.sized(2.0, smoke=0.05),
                         BURSTS=bursts().sized([(1, 4), (2, 8), (10, 40)]), BURST_SECONDS=_opt_sec.sized(2.0),
                         COPY_MB=_opt_int.sized(1024, smoke=4)),
    "02_tensor_cores": dict(SMOKE=boolean(), SIZES=list_of(_int, optional=True).sized([256, 512, 1024, 2048, 4096, 8192],
                                                                                       smoke=[32, 64, 128]),
                            DTYPES=list_of(one_of(*MATMUL_DTYPES), optional=True).sized(list(MATMUL_DTYPES)),
                            SWEEP_MIN_TIME_S=_opt_sec.sized(0.25, smoke=0.03), MIN_TIME_S=_opt_sec.sized(1.0, smoke=0.05),
                            BIG_N=_opt_int.sized(8192, smoke=128), SIZE_BIG=_opt_int.sized(4096, smoke=128),
                            SIZE_SMALL=_opt_int.sized(512, smoke=32), ALIGN_N=integer(2, optional=True).sized(4096, smoke=128),
                            ALIGN_BATCH=_opt_int.sized(32, smoke=4), ALIGN_SEQ=_opt_int.sized(1024, smoke=64),
                            ALIGN_HIDDEN=_opt_int.sized(768, smoke=64), ALIGN_HEADS=_opt_int.sized(12, smoke=4),
                            ROUNDS=_opt_int.sized(12, smoke=2), FEW_ROUNDS=_opt_int.sized(2, smoke=2)),
    "03_fusion": dict(SMOKE=boolean(), ELEMENTWISE_NUMEL=_opt_int.sized(1 << 26, smoke=1 << 18),
                      MODEL=gpt_dict(optional=True).sized(
                          dict(vocab_size=8192, n_layer=4, n_head=8, n_embd=512, block_size=256),
                          smoke=dict(vocab_size=512, n_layer=2, n_head=2, n_embd=64, block_size=64)),
                      INFER_MODEL=gpt_dict(optional=True).sized(
                          dict(vocab_size=2048, n_layer=1, n_head=8, n_embd=512, block_size=128),
                          smoke=dict(vocab_size=512, n_layer=2, n_head=2, n_embd=64, block_size=64)),
                      TRAIN_BATCH=_opt_int.sized(128, smoke=4), INFER_BATCH=_opt_int.sized(2),
                      INFER_SEQ=_opt_int.sized(128, smoke=32),
                      SWEEP_MODES=list_of(one_of(*COMPILE_MODES), optional=True).sized(
                          ["default", "reduce-overhead", "max-autotune-no-cudagraphs"]),
                      TIME_BUDGET_S=_opt_sec.sized(270), MIN_TIME_S=_opt_sec.sized(0.25, smoke=0.05),
                      TRAIN_MIN_TIME_S=_opt_sec.sized(1.0, smoke=0.05), TRAIN_ROUNDS=_opt_int.sized(6, smoke=3),
                      COMPILE_ALL=Param(lambda n, v: v if v is None else _bool(n, v), "True, False or None").sized(
                          True, smoke=False)),
    "04_sync_points": dict(SMOKE=boolean(),
                           MODEL=gpt_dict(optional=True).sized(
                               dict(vocab_size=8192, n_layer=4, n_head=8, n_embd=512, block_size=256),
                               smoke=dict(vocab_size=256, n_layer=1, n_head=2, n_embd=32, block_size=32)),
                           BATCH=_opt_int.sized(64, smoke=2), STEPS_PER_CALL=_opt_int.sized(8, smoke=2),
                           EVAL_BATCHES=_opt_int.sized(8, smoke=4), EVAL_BATCH=_opt_int.sized(64, smoke=8),
                           COPY_MB=_opt_int.sized(256, smoke=16), OVERLAP_CHUNKS=_opt_int.sized(8, smoke=4),
                           OVERLAP_CHUNK_MB=_opt_int.sized(64, smoke=8), MIN_TIME_S=_opt_sec.sized(None, smoke=0.05),
                           LOOP_MIN_TIME_S=_opt_sec.sized(1.5, smoke=0.05), LOOP_ROUNDS=_opt_int.sized(24, smoke=3),
                           STREAM_ROUNDS=_opt_int.sized(8, smoke=3),
                           TRAIN_MIN_TIME_S=_opt_sec.sized(1.0, smoke=0.05), TRAIN_ROUNDS=_opt_int.sized(96, smoke=3),
                           CONTEXT_ROUNDS=_opt_int.sized(32, smoke=3),
                           QUEUED_MS=number(optional=True).sized(20, smoke=2)),
    "05_data_overlap": dict(SMOKE=boolean(), N_IMAGES=_opt_int.sized(2048, smoke=48),
                            IMAGE_SIZE=integer(8, optional=True).sized(128, smoke=32),
                            BATCH_SIZE=_opt_int.sized(64, smoke=8),
                            GUIDE_BATCH=_opt_int.sized(32, smoke=8), CNN_WIDTH=_opt_int.sized(64, smoke=8),
                            SWEEP_BATCHES=_opt_int.sized(10, smoke=3), BATCHES_PER_CALL=_opt_int.sized(4, smoke=2),
                            PREFETCH_BATCH=_opt_int.sized(256, smoke=16),
                            WORKERS=list_of(integer(0, MAX_WORKERS), optional=True).sized(None, smoke=[0, 1, 2]),
                            MIN_TIME_S=_opt_sec.sized(None, smoke=0.05)),
    "06_batch_size": dict(SMOKE=boolean(),
                          MODEL=one_of("gpt2_small", "smoke", None).sized("gpt2_small", smoke="smoke"),
                          SEQ_LEN=_opt_int.sized(1024, smoke=32), SWEEP_SEQ_LEN=_opt_int.sized(128, smoke=16),
                          MAX_BATCH=_opt_int.sized(256, smoke=32), BATCH_SIZES=list_of(_int, optional=True),
                          ACCUM_STEPS=_opt_int.sized(4), ACCUM_BATCH=_opt_int.sized(32), SIM_MEMORY_MB=_opt_sec.sized(8),
                          MIN_TIME_S=_opt_sec.sized(None, smoke=0.05), UTIL_SEQ_LEN=_opt_int.sized(512, smoke=16),
                          UTIL_TIME_S=_opt_sec.sized(3.0, smoke=0.05)),
    "07_mixed_precision": dict(SMOKE=boolean(), N_LAYER=_opt_int.sized(8, smoke=2), N_HEAD=_opt_int.sized(12, smoke=2),
                               N_EMBD=_opt_int.sized(768, smoke=64), SEQ_LEN=_opt_int.sized(512, smoke=32),
                               VOCAB_SIZE=_opt_int.sized(50304, smoke=512), BATCH_SIZE=_opt_int.sized(16, smoke=2),
                               LOSS_STEPS=_opt_int.sized(80, smoke=25), TIME_SECONDS=_opt_sec.sized(1.0, smoke=0.05),
                               MATMUL_SIZE=_opt_int.sized(8192, smoke=256),
                               MATMUL_ROUNDS=integer(0, optional=True).sized(4),
                               ROUNDS=integer(0, optional=True).sized(4, smoke=2),
                               SMALL_GRAD_MULTIPLIER=number(maximum=1.0, optional=True).sized(2.0**-10),
                               CORPUS_BYTES=_opt_int.sized(4_000_000, smoke=300_000)),
    "08_case_study": dict(SMOKE=boolean(), N_LAYER=_opt_int.sized(12, smoke=2), N_HEAD=_opt_int.sized(12, smoke=2),
                          N_EMBD=_opt_int.sized(1536, smoke=64), SEQ_LEN=_opt_int.sized(1024, smoke=64),
                          VOCAB_SIZE=_opt_int.sized(50257, smoke=300), NAIVE_BATCH=_opt_int.sized(8, smoke=4),
                          BATCH_SIZE=_opt_int.sized(32, smoke=8), GRAD_ACCUM=_opt_int.sized(2),
                          WORKERS=integer(0, MAX_WORKERS, optional=True).sized(4, smoke=1),
                          STEP_SECONDS=_opt_sec.sized(1.5, smoke=0.1),
                          ROUNDS=integer(0, optional=True).sized(8, smoke=4),
                          LOSS_STEPS=_opt_int.sized(20, smoke=10),
                          CORPUS_BYTES=_opt_int.sized(4_000_000, smoke=300_000),
                          COMPILE=boolean(), CUDNN_ATTENTION=boolean(), FUSED_LOSS=boolean(), BF16_WEIGHTS=boolean(),
                          COMPILE_MODE=one_of(*COMPILE_MODES), COMPILE_IN_SMOKE=boolean()),
    "09_profiling": dict(SMOKE=boolean(), D=_opt_int.sized(1024, smoke=32), DEPTH=_opt_int.sized(8, smoke=2),
                         BATCH=_opt_int.sized(4096, smoke=16), STEPS_PER_CALL=_opt_int.sized(3, smoke=2),
                         PROFILE_STEPS=_opt_int.sized(2), OVERHEAD_BLOCKS=_opt_int.sized(96, smoke=8),
                         LAUNCH_BOUND_BLOCKS=_opt_int.sized(40, smoke=8),
                         BLOCK_S=_opt_sec.sized(0.08, smoke=0.005), OVERHEAD_ROUNDS=_opt_int.sized(120, smoke=2),
                         LAUNCH_BOUND_ROUNDS=_opt_int.sized(30, smoke=2),
                         ROUND_S=_opt_sec.sized(0.1, smoke=0.01),
                         SMALL=Param(lambda n, v: v if v is None else _int_dict(n, v, ("D", "DEPTH", "BATCH")),
                                     "a dict of ints: D, DEPTH, BATCH, or None").sized(
                             {"D": 64, "DEPTH": 2, "BATCH": 8}, smoke={"D": 16, "DEPTH": 1, "BATCH": 4}),
                         GPU_BOUND_BATCH=_opt_int.sized(16384, smoke=32), TRACK_STEPS=_opt_int.sized(150, smoke=20),
                         CASE_STEPS=_opt_int.sized(10, smoke=4), MIN_TIME_S=_opt_sec.sized(0.5, smoke=0.05)),
    "10_multi_gpu": dict(SMOKE=boolean(), NPROC=integer(1, MAX_WORKERS, optional=True), N_LAYER=_opt_int.sized(12, smoke=2),
                         N_HEAD=_opt_int.sized(12, smoke=2), N_EMBD=_opt_int.sized(768, smoke=64),
                         SEQ_LEN=_opt_int.sized(1024, smoke=64), VOCAB_SIZE=_opt_int.sized(50304, smoke=512),
                         BATCH_SIZE=_opt_int.sized(16, smoke=4), GRAD_ACCUM=_opt_int.sized(4, smoke=2),
                         ROUNDS=_opt_int.sized(5, smoke=3), STEPS_PER_ROUND=_opt_int.sized(4, smoke=2),
                         WARMUP_STEPS=integer(0, optional=True).sized(3, smoke=2),
                         MAX_MESSAGE_MB=_opt_int.sized(1024, smoke=4), ROUND_S=_opt_sec.sized(0.05, smoke=0.02),
                         SAVE_TRACES=boolean(), LAUNCH_TIMEOUT_S=_sec),
    "11_your_model": dict(SMOKE=boolean(), MODEL=one_of("lm", "cnn"), BATCH=_opt_int.sized(32, smoke=4),
                          WIDTH=_opt_int.sized(512, smoke=32), DEPTH=_opt_int.sized(6, smoke=1),
                          SEQ_LEN=_opt_int.sized(512, smoke=32), IMAGE_SIZE=_opt_int.sized(64, smoke=16),
                          VOCAB=_opt_int.sized(8192, smoke=128), MAX_BATCH=_opt_int.sized(512, smoke=16),
                          TRACK_STEPS=_opt_int.sized(100, smoke=10), TIMELINE_S=_opt_sec.sized(10.0, smoke=2.0),
                          N_DATA=_opt_int.sized(2048, smoke=64), MIN_TIME_S=_opt_sec.sized(1.0, smoke=0.05),
                          DIAGNOSE_S=_opt_sec.sized(60.0, smoke=10.0),
                          RUN_NAME=Param(_run_name, "None or a short name: letters, digits, - and _")),
}


def schema_for(notebook: str | Mapping[str, Param]) -> Mapping[str, Param]:
    """The schema of a notebook by name (its stem, e.g. "02_tensor_cores"), or a schema given as a dict."""
    if not isinstance(notebook, str):
        return notebook
    if notebook not in SCHEMAS:
        raise ValueError(f"no parameter schema for notebook {notebook!r}; known: {', '.join(SCHEMAS)}")
    return SCHEMAS[notebook]


def check_params(values: Mapping[str, Any], schema: str | Mapping[str, Param], *,
                 unknown: bool = False) -> dict[str, Any]:
    """Check the parameters found in `values` (a notebook's `globals()` or a dict) against `schema`.

    Raises ValueError naming the parameter, its value and what it accepts; with `unknown=True` a name the schema
    lacks is an error too (a `-p` typo must not silently run the default). Returns the checked parameters."""
    spec = schema_for(schema)
    if unknown:
        for name in values:
            if name not in spec:
                close = difflib.get_close_matches(name, list(spec), n=1)
                hint = f" (did you mean {close[0]}?)" if close else ""
                raise ValueError(f"unknown parameter {name!r}{hint}; this notebook takes: {', '.join(spec)}")
    checked = {}
    for name, param in spec.items():
        if name in values:
            param(name, values[name])
            checked[name] = values[name]
    return checked


def parse_value(text: str) -> Any:
    """A `-p NAME VALUE` value as Python reads it: 4096, 0.5, True, None, [32, 64], {"a": 1}; else the string.

    "false" and "true" stay strings (Python spells them False and True) and are then refused where a bool
    is wanted, rather than being read as a truthy string.
    """
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return text


def too_big(params: Mapping[str, Any], names: Iterable[str], have: int | None) -> str | None:
    """Why a `*_MB` parameter cannot fit (a copy holds a source and a destination), or None."""
    if not have:
        return None
    for name in sorted(set(names) & set(params)):
        value = params[name]
        if name.endswith("_MB") and isinstance(value, (int, float)) and not isinstance(value, bool):
            need = 2 * value * 2**20
            if need > have:
                return (f"{name}={value} needs {need / 2**30:,.0f} GiB (a source and a destination buffer); this "
                        f"machine has {have / 2**30:,.0f} GiB")
    return None
