"""A configurable GPT training loop: one field per optimization, so a notebook can switch them on one at a time.

    cfg = TrainConfig(model=GPTConfig.gpt2_small(vocab_size=50257))   # the defaults are the naive loop
    fast = cfg.replace(tf32=True, autocast="bf16", fused_adamw=True, attn="sdpa", sync_every_step=False)
    res = train_steps(fast, steps=50, tokens=tokens)                  # step time, tokens/s, MFU, memory, losses

`TrainConfig()` is deliberately naive: FP32, the hand-written attention, a small batch, `.item()` every step,
no DataLoader workers, no pinned memory, eager mode, GPT-2's unpadded vocabulary. `waterfall_configs()`
turns those switches on cumulatively for the case study (notebook 08). The same seed gives the same initial
weights and the same data order in every configuration (batches are consecutive windows of one seeded stream,
so 4 x 16 sequences per step and 8 x 8 sequences per step see the same data).
"""
from __future__ import annotations
from .config import (AUTOCAST_DTYPES, PARAM_DTYPES, _STREAM_LENGTH, COMPILE_MODES, TrainConfig, gpt_num_params, describe, waterfall_configs, halve_batch)  # noqa: F401
from .trainer import (_attention_backend, cudnn_attention_available, build_model, initial_state, _param_groups, Trainer,  # noqa: F401
                      _timed_steps, train_steps)
from .result import TrainResult  # noqa: F401
from .runs import (ConfigRun, measure_config, measure_optimised, optimised_config, per_items, with_peak, loss_gap_estimate)  # noqa: F401
from .numerics import (FormatInfo, format_info, effective_mantissa_bits, UnderflowReport, gradient_underflow, plot_underflow)  # noqa: F401
from .tables import (smooth, Table)  # noqa: F401

__all__ = ['AUTOCAST_DTYPES', 'PARAM_DTYPES', 'COMPILE_MODES', 'TrainConfig', 'gpt_num_params', 'describe', 'waterfall_configs', 'halve_batch', 'cudnn_attention_available', 'build_model', 'initial_state', 'Trainer', 'TrainResult', 'train_steps', 'ConfigRun', 'measure_config', 'measure_optimised', 'optimised_config', 'per_items', 'with_peak', 'loss_gap_estimate', 'FormatInfo', 'format_info', 'effective_mantissa_bits', 'UnderflowReport', 'gradient_underflow', 'plot_underflow', 'smooth', 'Table']
