"""What machine this is: device facts, datasheet peaks and measured peaks."""
from __future__ import annotations

import math
import os
import platform
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from .dtypes import DTYPES, check_dtype  # noqa: F401 (one source; these names stay importable here)
from .text import si


def usable_cores() -> int:
    """CPU cores this process may use: the affinity mask, capped by a cgroup CPU quota (containers often
    report the host's full count in os.cpu_count())."""
    try:
        n = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        n = os.cpu_count() or 1
    quota = None
    try:  # cgroup v2: "max 100000" or "<quota> <period>"
        q, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()[:2]
        quota = None if q == "max" else int(q) / int(period)
    except (OSError, ValueError):
        try:  # cgroup v1
            q = int(Path("/sys/fs/cgroup/cpu/cpu.cfs_quota_us").read_text())
            period = int(Path("/sys/fs/cgroup/cpu/cpu.cfs_period_us").read_text())
            quota = q / period if q > 0 and period > 0 else None
        except (OSError, ValueError):
            quota = None
    if quota:
        n = min(n, max(1, math.ceil(quota)))
    return max(1, n)


def physical_cores(topology: Path = Path("/sys/devices/system/cpu")) -> int | None:
    """Physical cores behind the CPUs this process may run on: hardware threads of one core (hyper-threads) count
    once. None where the kernel does not expose the topology (not Linux, some containers).

    Worker processes on two threads of one core share its execution units, so a host of 16 CPUs on 8 cores may
    stop scaling past 8 busy processes."""
    try:
        cpus = sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return None
    cores = set()
    for cpu in cpus:
        try:
            cores.add((topology / f"cpu{cpu}" / "topology" / "thread_siblings_list").read_text().strip())
        except OSError:
            return None
    return len(cores) or None


@dataclass(frozen=True)
class PeakSpec:
    """Datasheet dense peaks of one GPU model: TFLOP/s per dtype and memory bandwidth in GB/s."""

    model: str
    tflops: dict[str, float]
    bandwidth_gbs: float
    source: str


def _spec(model: str, fp32: float, tf32: float | None, bf16: float | None, fp16: float,
          fp8: float | None, bw: float, source: str) -> PeakSpec:
    tflops = {"fp32": fp32, "tf32": tf32, "bf16": bf16, "fp16": fp16, "fp8": fp8}
    return PeakSpec(model, {k: v for k, v in tflops.items() if v is not None}, bw, source)


# Dense (not 2:4 sparse) tensor-core peaks. NVIDIA datasheets print sparse figures with an asterisk;
# those are halved here. GeForce figures are "FP32 accumulate", the mode PyTorch uses.
# Order matters: the first pattern that matches the device name wins.
PEAK_TABLE: list[tuple[str, PeakSpec]] = [
    # GH200 first: its name contains "H200" ("NVIDIA GH200 480GB"), but its GPU is an H100 with its own memory.
    (r"GH200.*HBM3e|GH200.*144G", _spec("GH200 (144GB HBM3e)", 67, 494.7, 989.4, 989.4, 1978.9, 4900,
                                        "https://www.nvidia.com/en-us/data-center/grace-hopper-superchip/ "
                                        "(datasheet, HBM3e column, sparse/2)")),
    (r"GH200", _spec("GH200 (96GB HBM3)", 67, 494.7, 989.4, 989.4, 1978.9, 4000,
                     "https://www.nvidia.com/en-us/data-center/grace-hopper-superchip/ (datasheet, HBM3 column, "
                     "sparse/2)")),
    (r"\bB200\b", _spec("B200", 75, 1125, 2250, 2250, 4500, 8000,
                        "https://www.nvidia.com/en-us/data-center/hgx/ (HGX B200 datasheet: eight-GPU totals "
                        "/ 8, sparse/2)")),
    (r"\bH200.*NVL", _spec("H200 NVL", 60, 417.5, 835.5, 835.5, 1670.5, 4800,
                           "https://www.nvidia.com/en-us/data-center/h200/ (datasheet, NVL column, sparse/2)")),
    (r"\bH200", _spec("H200 SXM", 67, 494.7, 989.4, 989.4, 1978.9, 4800,
                      "https://www.nvidia.com/en-us/data-center/h200/ (datasheet, sparse/2)")),
    (r"H100.*NVL", _spec("H100 NVL", 60, 417.5, 835.5, 835.5, 1670.5, 3900,
                         "https://www.nvidia.com/en-us/data-center/h100/ (datasheet, NVL column, sparse/2)")),
    (r"H100.*PCIe", _spec("H100 PCIe", 51, 378, 756, 756, 1513, 2000,
                          "https://www.nvidia.com/en-us/data-center/h100/ (datasheet, PCIe column, sparse/2)")),
    (r"H100", _spec("H100 SXM", 67, 494.7, 989.4, 989.4, 1978.9, 3350,
                    "https://www.nvidia.com/en-us/data-center/h100/ (datasheet, SXM column, sparse/2)")),
    (r"A100.*80GB.*PCIe|A100.*PCIE.*80GB", _spec("A100 80GB PCIe", 19.5, 156, 312, 312, None, 1935,
                                                 "https://www.nvidia.com/en-us/data-center/a100/ (datasheet)")),
    (r"A100.*80GB", _spec("A100 80GB SXM", 19.5, 156, 312, 312, None, 2039,
                          "https://www.nvidia.com/en-us/data-center/a100/ (datasheet)")),
    (r"A100", _spec("A100 40GB", 19.5, 156, 312, 312, None, 1555,
                    "https://www.nvidia.com/en-us/data-center/a100/ (datasheet, 40GB)")),
    (r"L40S", _spec("L40S", 91.6, 183, 362, 362, 733, 864,
                    "https://www.nvidia.com/en-us/data-center/l40s/ (datasheet, sparse/2)")),
    (r"\bL40\b", _spec("L40", 90.5, 90.5, 181, 181, 362, 864,
                       "https://www.nvidia.com/en-us/data-center/l40/ (datasheet, sparse/2)")),
    (r"\bL4\b", _spec("L4", 30.3, 60, 121, 121, 242.5, 300,
                      "https://www.nvidia.com/en-us/data-center/l4/ (datasheet, sparse/2)")),
    (r"\bA10G\b", _spec("A10G", 35, 35, 70, 70, None, 600,
                        "AWS's A10G (EC2 G5) has no NVIDIA datasheet; figures as compiled in "
                        "https://www.baseten.co/blog/nvidia-a10-vs-a10g-for-ml-model-inference/ (dense)")),
    (r"\bA10\b", _spec("A10", 31.2, 62.5, 125, 125, None, 600,
                       "https://www.nvidia.com/en-us/data-center/products/a10-gpu/ (datasheet)")),
    (r"RTX 6000 Ada", _spec("RTX 6000 Ada Generation", 91.1, 182.1, 364.2, 364.2, 728.5, 960,
                            "NVIDIA Ada Lovelace professional GPU architecture whitepaper, RTX 6000 Ada "
                            "(FP32 accumulate, dense)")),
    (r"RTX A6000", _spec("RTX A6000", 38.7, 77.4, 154.8, 154.8, None, 768,
                         "NVIDIA Ampere GA102 architecture whitepaper, RTX A6000 (FP32 accumulate, dense)")),
    (r"RTX 5090(?! D)", _spec("GeForce RTX 5090", 104.8, 104.8, 209.5, 209.5, 419, 1792,
                        "NVIDIA RTX Blackwell GPU architecture whitepaper, RTX 5090 (FP32 accumulate, dense)")),
    (r"RTX 4090", _spec("GeForce RTX 4090", 82.6, 82.6, 165.2, 165.2, 330.3, 1008,
                        "NVIDIA Ada Lovelace architecture whitepaper, table 2 (FP32 accumulate, dense)")),
    (r"RTX 3090", _spec("GeForce RTX 3090", 35.6, 35.6, 71, 71, None, 936,
                        "NVIDIA Ampere GA102 architecture whitepaper, table 9 (FP32 accumulate, dense)")),
    (r"T4\b", _spec("T4", 8.1, None, None, 65, None, 320,
                    "https://www.nvidia.com/en-us/data-center/tesla-t4/ (datasheet; no TF32/BF16 tensor cores)")),
    (r"V100.*PCI", _spec("V100 PCIe", 14, None, None, 112, None, 900,
                         "https://images.nvidia.com/content/technologies/volta/pdf/volta-v100-datasheet-update-us-1165301-r5.pdf")),
    (r"V100", _spec("V100 SXM2", 15.7, None, None, 125, None, 900,
                    "https://images.nvidia.com/content/technologies/volta/pdf/volta-v100-datasheet-update-us-1165301-r5.pdf")),
]


def lookup_peaks(name: str) -> PeakSpec | None:
    """Datasheet peaks for a GPU name as CUDA reports it, or None for a GPU not in the table."""
    if not isinstance(name, str) or not name.strip():
        raise ValueError(f"name={name!r} must be a GPU name as CUDA reports it, e.g. 'NVIDIA H100 80GB HBM3' "
                         "(gl.get_device().name)")
    for pattern, spec in PEAK_TABLE:
        if re.search(pattern, name, flags=re.IGNORECASE):
            return spec
    return None


def slugify(name: str) -> str:
    """A folder-safe name for a device: 'NVIDIA H200' -> 'nvidia-h200'."""
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-") or "unknown"


@dataclass(frozen=True)
class DeviceInfo:
    """Facts about the device the course runs on (a CUDA GPU, or the CPU as a fallback)."""

    kind: str  # "cuda" or "cpu"
    name: str
    index: int | None = None
    capability: tuple[int, int] | None = None
    sm_count: int | None = None
    memory_gb: float | None = None
    uuid: str | None = None
    pci_bus_id: str | None = None
    driver: str | None = None
    torch_version: str = torch.__version__
    cuda_version: str | None = torch.version.cuda
    cpu_cores: int = field(default_factory=usable_cores)
    cpu: str | None = None  # the host's processor: launch-bound loops and data loading run at its speed
    datasheet_peaks: PeakSpec | None = None  # the datasheet's dense peaks (measured ones: gpulab.measuring.peaks)
    note: str = ""

    @property
    def peaks(self) -> PeakSpec | None:
        """Deprecated: the datasheet peaks, now `datasheet_peaks` (measured peaks are `gl.measure_peaks()`)."""
        import warnings

        warnings.warn("DeviceInfo.peaks is deprecated: use DeviceInfo.datasheet_peaks (the datasheet's dense peaks; "
                      "measured peaks come from gl.measure_peaks())", DeprecationWarning, stacklevel=2)
        return self.datasheet_peaks

    @property
    def is_cuda(self) -> bool:
        """True for a CUDA GPU."""
        return self.kind == "cuda"

    @property
    def slug(self) -> str:
        """The device's name as a folder name (results go under it), e.g. nvidia-h200."""
        return slugify(self.name) if self.is_cuda else "cpu"

    @property
    def torch_device(self) -> torch.device:
        """The torch.device to put tensors on (cuda:N or cpu)."""
        return torch.device("cuda", self.index) if self.is_cuda else torch.device("cpu")

    def datasheet_tflops(self, dtype: str) -> float | None:
        """The datasheet dense peak for `dtype`, or None (unknown GPU, no such tensor core, or a CPU)."""
        dtype = check_dtype(dtype)
        return self.datasheet_peaks.tflops.get(dtype) if self.datasheet_peaks else None

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (what a result file records)."""
        d = asdict(self)
        d["slug"] = self.slug
        d["capability"] = list(self.capability) if self.capability else None
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> DeviceInfo:
        """A DeviceInfo from `to_dict`'s dict (older result files too)."""
        d = dict(d)
        if "peaks" in d and "datasheet_peaks" not in d:  # files written before the rename
            d["datasheet_peaks"] = d.pop("peaks")
        d = {k: v for k, v in d.items() if k in cls.__dataclass_fields__}
        if d.get("capability"):
            d["capability"] = tuple(d["capability"])
        if d.get("datasheet_peaks"):
            d["datasheet_peaks"] = PeakSpec(**d["datasheet_peaks"])
        return cls(**d)

    def _repr_html_(self) -> str:
        rows = [("device", self.name), ("torch", self.torch_version), ("CPU cores", self.cpu_cores)]
        if self.cpu and self.cpu != self.name:
            rows.append(("host CPU", self.cpu))
        if self.is_cuda:
            rows += [("compute capability", ".".join(map(str, self.capability or ()))),
                     ("SMs", self.sm_count),
                     ("memory", "n/a" if self.memory_gb is None else f"{self.memory_gb:.1f} GB"), ("driver", self.driver)]
            if self.datasheet_peaks:
                ds = self.datasheet_peaks
                # three significant figures in the page's units (3.35 TB/s, not 3350 GB/s)
                rows += [(f"datasheet {k.upper()}", si(v * 1e12, "FLOP/s")) for k, v in ds.tflops.items()]
                rows += [("datasheet memory bandwidth", si(ds.bandwidth_gbs * 1e9, "B/s")), ("peaks source", ds.source)]
        if self.note:
            rows.append(("note", self.note))
        body = "".join(f"<tr><th style='text-align:left'>{k}</th><td style='text-align:left'>{v}</td></tr>"
                       for k, v in rows)
        return f"<table>{body}</table>"

    def __str__(self) -> str:
        return f"{self.name} ({self.kind})" + (f" - {self.note}" if self.note else "")


def _driver_version() -> str | None:
    try:
        import pynvml
        pynvml.nvmlInit()
        v = pynvml.nvmlSystemGetDriverVersion()
        return v.decode() if isinstance(v, bytes) else v
    except Exception:  # NVML missing or unusable: the driver version is only informative
        return None


def cpu_name() -> str:
    """The processor's model name ("AMD EPYC 7R13 Processor"), not just its architecture ("x86_64")."""
    try:
        for line in Path("/proc/cpuinfo").read_text(errors="replace").splitlines():
            key, _, value = line.partition(":")
            if key.strip() in ("model name", "Model", "cpu model") and value.strip():
                return " ".join(value.split())
    except OSError:
        pass
    if platform.system() == "Darwin":
        import subprocess
        try:
            out = subprocess.run(["sysctl", "-n", "machdep.cpu.brand_string"], capture_output=True, text=True,
                                 timeout=5).stdout.strip()
            if out:
                return out
        except (OSError, subprocess.SubprocessError):
            pass
    proc = platform.processor()
    return proc if proc and proc != platform.machine() else (platform.machine() or "CPU")


def get_device(index: int | None = None) -> DeviceInfo:
    """Describe the current CUDA device (or CUDA device `index`), or the CPU when there is no CUDA GPU.

    Asking for a GPU index on a machine without one is an error, not a silent CPU.
    """
    if index is not None and (isinstance(index, bool) or not isinstance(index, int) or index < 0):
        raise ValueError(f"index={index!r} must be a non-negative int or None")
    if not torch.cuda.is_available():
        if index is not None:
            raise ValueError(f"index={index} asks for CUDA device {index}, but no CUDA GPU is visible here; "
                             "use get_device() for the CPU")
        host = cpu_name()
        return DeviceInfo(kind="cpu", name=host, cpu=host,
                          note="no CUDA GPU: GPU-only steps are skipped; compare with the reference GPU's numbers")
    index = torch.cuda.current_device() if index is None else index
    if index >= torch.cuda.device_count():
        raise ValueError(f"index={index} but only {torch.cuda.device_count()} CUDA device(s) are visible")
    p = torch.cuda.get_device_properties(index)
    peaks = lookup_peaks(p.name)
    note = "" if peaks else (f"'{p.name}' is not in gpulab's peak table: MFU against the datasheet is unavailable; "
                             "use measure_peaks() for a measured peak")
    uuid = str(getattr(p, "uuid", "")) or None
    if uuid and not uuid.startswith("GPU-"):
        uuid = f"GPU-{uuid}"
    pci = None
    if hasattr(p, "pci_bus_id"):
        pci = f"{p.pci_domain_id:08x}:{p.pci_bus_id:02x}:{p.pci_device_id:02x}.0"
    return DeviceInfo(kind="cuda", name=p.name, index=index, capability=(p.major, p.minor),
                      sm_count=p.multi_processor_count, memory_gb=p.total_memory / 1e9, uuid=uuid,
                      pci_bus_id=pci, driver=_driver_version(), cpu=cpu_name(), datasheet_peaks=peaks, note=note)


def host_difference(mine: dict[str, Any], reference: dict[str, Any]) -> str | None:
    """One sentence when two result files' `device` dicts ran on different host CPUs, else None (also for files
    written before the host was recorded)."""
    a, b = mine.get("cpu"), reference.get("cpu")
    if not a or not b or a == b:
        return None
    return (f"The host CPUs differ ({a} here, {b} in the reference): launch-bound loops, Python overhead and "
            "data loading run at the host's speed, so their numbers and verdicts can differ on the same GPU.")


class float32_matmul_precision:
    """Context manager: FP32 matmuls in TF32 ('high') or true FP32 ('highest'), restored on exit."""

    def __init__(self, precision: str):
        if precision not in ("highest", "high", "medium"):
            raise ValueError(f"precision={precision!r}; allowed: highest, high, medium")
        self.precision = precision

    def __enter__(self):
        self._old = torch.get_float32_matmul_precision()
        torch.set_float32_matmul_precision(self.precision)
        return self

    def __exit__(self, *exc):
        torch.set_float32_matmul_precision(self._old)


def as_torch_device(device: Any = None) -> torch.device:
    """A torch.device from a str, a torch.device or a DeviceInfo; None means CUDA if present, else CPU."""
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return getattr(device, "torch_device", None) or torch.device(device)


def synchronize(device: torch.device | str | None = None) -> None:
    """Wait for queued GPU work; a no-op on the CPU."""
    if torch.cuda.is_available() and (device is None or torch.device(device).type == "cuda"):
        torch.cuda.synchronize(device)


def dtype_support(device: DeviceInfo, dtype: str) -> str | None:
    """None when `device` can run matmuls in `dtype` on its matrix units, else the reason it cannot."""
    dtype = check_dtype(dtype)
    if not device.is_cuda:
        return "needs a CUDA GPU with tensor cores" if dtype in ("tf32", "fp8") else None
    cap = device.capability or (0, 0)
    if dtype in ("tf32", "bf16") and cap < (8, 0):
        return f"{dtype.upper()} tensor cores arrive with Ampere (sm_80); this GPU is sm_{cap[0]}{cap[1]}"
    if dtype == "fp8":
        if cap < (8, 9):
            return f"FP8 tensor cores arrive with Ada/Hopper (sm_89+); this GPU is sm_{cap[0]}{cap[1]}"
        if not hasattr(torch, "_scaled_mm") or not hasattr(torch, "float8_e4m3fn"):
            return "this PyTorch has no torch._scaled_mm / float8 dtypes"
    return None
