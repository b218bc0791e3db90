"""Faults and odd input met where a reader meets them: each named in one line, nothing half-written, no noise."""
from __future__ import annotations

import sys

import torch

import gpulab as gl


def test_profile_keeps_the_profilers_own_log_lines_off_the_page(capfd):
    """The profiler library writes "USDT:... profiler_start" to stderr from C++; the reader's own lines still show."""
    x = torch.randn(32, 32)

    def step():
        print("the reader's line", file=sys.stderr)
        return x @ x

    summary = gl.profile(step, steps=2, warmup=0)
    err = capfd.readouterr().err
    assert summary.steps == 2 and "USDT" not in err and "profiler_start" not in err
    assert err.count("the reader's line") == 3  # one untimed warm-up step of the schedule, then two
