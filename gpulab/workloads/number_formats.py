"""Number formats as torch.finfo reports them (FP32, TF32, BF16, FP16, FP8): bits, range and precision, in a table."""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Sequence

import torch


@dataclass
class FormatInfo:
    """A floating-point format's layout and limits, computed from torch.finfo (TF32 derived from FP32)."""

    name: str
    torch_dtype: str | None  # None for TF32: a tensor-core mode, not a storage dtype
    bits: int
    exponent_bits: int
    mantissa_bits: int  # stored fraction bits (the leading 1 is implicit)
    eps: float  # gap between 1.0 and the next representable number: 2**-mantissa_bits
    max: float
    smallest_normal: float
    digits: float  # decimal digits carried: (mantissa_bits + 1) · log10(2)
    note: str = ""

    @property
    def smallest_subnormal(self) -> float:
        """The smallest positive value: the smallest normal times eps."""
        return self.smallest_normal * self.eps

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _from_finfo(name: str, dtype: torch.dtype, note: str = "") -> FormatInfo:
    f = torch.finfo(dtype)
    mant = round(-math.log2(f.eps))
    return FormatInfo(name=name, torch_dtype=str(dtype).removeprefix("torch."), bits=f.bits,
                      exponent_bits=f.bits - 1 - mant, mantissa_bits=mant, eps=f.eps, max=f.max,
                      smallest_normal=f.smallest_normal, digits=(mant + 1) * math.log10(2), note=note)


def tf32_format(mantissa_bits: int = 10) -> FormatInfo:
    """TF32: FP32's 8-bit exponent with a 10-bit mantissa (19 bits used). Not a torch dtype: derived here.

    eps = 2**-10; the exponent range, hence max and smallest normal, is FP32's.
    """
    f32 = torch.finfo(torch.float32)
    emax = math.floor(math.log2(f32.max))
    return FormatInfo(name="TF32", torch_dtype=None, bits=1 + 8 + mantissa_bits, exponent_bits=8,
                      mantissa_bits=mantissa_bits, eps=2.0 ** -mantissa_bits,
                      max=(2 - 2.0 ** -mantissa_bits) * 2.0 ** emax, smallest_normal=f32.smallest_normal,
                      digits=(mantissa_bits + 1) * math.log10(2),
                      note="not a torch dtype: FP32 tensors, multiplied on tensor cores with 10 mantissa bits; "
                           "eps derived as 2**-10")


def format_table() -> list[FormatInfo]:
    """FP32, TF32, BF16, FP16 and the two FP8 formats (when this torch has them), from torch.finfo."""
    rows = [_from_finfo("FP32", torch.float32), tf32_format(), _from_finfo("BF16", torch.bfloat16),
            _from_finfo("FP16", torch.float16)]
    if hasattr(torch, "float8_e4m3fn"):
        rows.append(_from_finfo("FP8 E4M3", torch.float8_e4m3fn, "no inf; the FP8 used for weights/activations"))
    if hasattr(torch, "float8_e5m2"):
        rows.append(_from_finfo("FP8 E5M2", torch.float8_e5m2, "wider range, for gradients"))
    return rows


def format_mismatches(info: FormatInfo, *, exponent_bits: int | None = None, mantissa_bits: int | None = None,
                      max_abs: float | None = None, digits: int | None = None, rel_tol: float = 0.02) -> list[str]:
    """What a printed table row gets wrong about `info` ([] when every given field agrees).

    `max_abs` agrees within `rel_tol` (tables round: ±3.4e38); `digits` agrees when it is the whole part of
    the decimal digits carried (FP32 carries 7.22, so "7 digits" agrees).
    """
    bad = []
    if exponent_bits is not None and exponent_bits != info.exponent_bits:
        bad.append(f"exponent bits {exponent_bits} (finfo: {info.exponent_bits})")
    if mantissa_bits is not None and mantissa_bits != info.mantissa_bits:
        bad.append(f"mantissa bits {mantissa_bits} (finfo: {info.mantissa_bits})")
    if max_abs is not None and not math.isclose(max_abs, info.max, rel_tol=rel_tol):
        bad.append(f"range ±{max_abs:g} (finfo: ±{info.max:.4g})")
    if digits is not None and digits != math.floor(info.digits):
        bad.append(f"{digits} digits (finfo: {info.digits:.2f})")
    return bad


def formats_html(rows: Sequence[FormatInfo]) -> str:
    """An HTML table of format rows."""
    head = ("<tr><th>format</th><th>torch dtype</th><th>bits</th><th>exponent</th><th>mantissa</th><th>eps</th>"
            "<th>max</th><th>smallest normal</th><th>decimal digits</th><th>note</th></tr>")
    body = "".join(
        f"<tr><td>{r.name}</td><td>{r.torch_dtype or '—'}</td><td>{r.bits}</td><td>{r.exponent_bits}</td>"
        f"<td>{r.mantissa_bits}</td><td>{r.eps:.3g}</td><td>{r.max:.4g}</td><td>{r.smallest_normal:.3g}</td>"
        f"<td>{r.digits:.2f}</td><td><small>{r.note}</small></td></tr>" for r in rows)
    return f"<table>{head}{body}</table>"
