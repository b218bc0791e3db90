"""Whether torch.compile can generate code here, and why not: the check behind every "needs a compiler"."""
from __future__ import annotations

import os
import shutil
import sys

import torch


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
