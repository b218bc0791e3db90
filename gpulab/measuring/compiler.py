"""Whether torch.compile can generate code here, and why not (the check behind every "needs a compiler"), and what a
compiled function's first call costs."""
from __future__ import annotations

import os
import shutil
import sys
import time
from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch.utils._pytree import tree_flatten

from .device import synchronize
from .text import plural, si


def _find_program(env: str, names: tuple[str, ...]) -> str | None:
    if os.environ.get(env):
        return shutil.which(os.environ[env].split()[0]) or None
    return next((p for p in (shutil.which(n) for n in names) if p), None)


def compiler_available(device: torch.device | str | None = None) -> tuple[bool, str]:
    """Whether torch.compile's default backend (inductor) can generate code for `device`, and why (not).

    CPU: a C++ compiler ($CXX, c++, g++ or clang++). CUDA: Triton, plus the C compiler ($CC, cc, gcc or clang) it
    builds its launcher with. Necessary, not sufficient: a broken toolchain still fails at the first call."""
    dev = torch.device(device) if device is not None else torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        import torch._dynamo as dynamo
        if not dynamo.is_dynamo_supported():
            return False, f"torch.compile does not support this Python ({sys.version.split()[0]}) or platform"
    except Exception as e:  # an import failure here means no compile at all
        return False, f"torch._dynamo is unavailable: {type(e).__name__}: {e}"
    if dev.type == "cuda":
        try:
            from torch.utils._triton import has_triton
            triton_ok = has_triton()
        except Exception:
            triton_ok = False
        if not triton_ok:
            return False, "Triton is missing or does not support this GPU: inductor writes its GPU kernels in Triton"
        cc = _find_program("CC", ("cc", "gcc", "clang"))
        if cc is None:
            return False, "no C compiler found: Triton needs one (cc, gcc or clang) to build its kernel launcher"
        import triton
        return True, f"Triton {triton.__version__}, C compiler {cc}"
    cxx = _find_program("CXX", ("c++", "g++", "clang++"))
    if cxx is None:
        return False, "no C++ compiler found: inductor compiles CPU kernels with one (install g++ or set $CXX)"
    return True, f"C++ compiler {cxx}"


@dataclass
class FirstCall:
    """What a compiled function's first call cost (it traces, lowers, generates and compiles), or why it failed."""

    seconds: float | None = None
    kernels: int | None = None  # kernels inductor generated during the call
    error: str = ""

    @property
    def ok(self) -> bool:
        return not self.error

    def __repr__(self) -> str:
        if not self.ok:
            return f"not compiled: {self.error}"
        return (f"first call (compile + one run): {si(self.seconds, 's')}, "
                f"{plural(self.kernels or 0, 'kernel')} generated")


def first_call(fn: Callable[..., Any], *args: Any) -> FirstCall:
    """Call a just-compiled `fn(*args)` once with a stopwatch, inductor's FX-graph cache off (the time is the
    compile's own work; kernel binaries may still come from an earlier run's disk cache). A compiler error comes
    back as `FirstCall.error`, not as an exception: a machine without a working toolchain says so and goes on.
    max-autotune's report of every candidate kernel (and of candidates that do not fit the GPU, which it skips)
    is kept off the page: nothing in it is for the reader to act on."""
    import contextlib
    import io
    import logging

    from torch._inductor import config, metrics

    metrics.reset()
    dev = next((a.device for a in tree_flatten(args)[0] if isinstance(a, torch.Tensor)), None)
    autotune_log = logging.getLogger("torch._inductor.select_algorithm")
    level = autotune_log.level
    autotune_log.setLevel(logging.CRITICAL)
    try:
        with config.patch({"fx_graph_cache": False, "autotune_local_cache": False}), \
                contextlib.redirect_stderr(io.StringIO()):
            synchronize(dev)
            t0 = time.perf_counter()
            fn(*args)
            synchronize(dev)
    except Exception as e:  # no compiler, a compiler error, an unsupported op
        lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
        return FirstCall(error=f"{type(e).__name__}: {' '.join(lines[:2])[:300]}")
    finally:
        autotune_log.setLevel(level)
    return FirstCall(time.perf_counter() - t0, metrics.generated_kernel_count)
