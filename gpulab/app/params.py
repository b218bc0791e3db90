"""The notebooks' parameter schemas live in the core, `gpulab.params`; these are the names the runner uses, and the
check of sizes in MiB against what the device can hold."""
from __future__ import annotations

from typing import Any, Iterable, Mapping

from ..params import SCHEMAS, Param, check_params, parse_value

__all__ = ["SCHEMAS", "Param", "check_params", "parse_value", "too_big"]


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
