"""The link between GPUs as the device reports it (NVLink or PCIe, its limit); bus bandwidth of a timed collective."""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

# Unidirectional GB/s of one NVLink link, keyed by NVML's version number (nvml.h NVML_NVLINK_VERSION_*: 1 = 1.0,
# 2 = 2.0, 3 = 2.2, 4 = 3.0, 5 = 3.1, 6 = 4.0, 7 = 5.0). Each is NVIDIA's per-GPU total for that generation over
# its link count, halved for one direction: 1.0 P100 160 GB/s over 4 links; 2.x V100 300 GB/s over 6;
# 3.x A100 600 GB/s over 12; 4.0 H100/H200 900 GB/s over 18; 5.0 B200 1.8 TB/s over 18.
NVLINK_GBS_PER_LINK = {1: 20.0, 2: 25.0, 3: 25.0, 4: 25.0, 5: 25.0, 6: 25.0, 7: 50.0}
NVLINK_NAMES = {1: "1.0", 2: "2.0", 3: "2.2", 4: "3.0", 5: "3.1", 6: "4.0", 7: "5.0"}
NVLINK_SOURCE = ("NVIDIA NVLink product page (nvidia.com/en-us/data-center/nvlink/): bidirectional GB/s per GPU "
                 "by generation / links / 2; version numbers from nvml.h")
# Unidirectional GB/s per PCIe lane after line encoding (8b/10b for Gen1-2, 128b/130b for Gen3-5, FLIT for Gen6).
PCIE_GBS_PER_LANE = {1: 0.25, 2: 0.5, 3: 0.985, 4: 1.969, 5: 3.938, 6: 7.563}
PCIE_SOURCE = "PCI-SIG base specifications: 2.5/5/8/16/32/64 GT/s per lane and their encodings"


@dataclass
class LinkInfo:
    """The GPU-to-GPU link this device reports, and its unidirectional bandwidth limit per GPU (GB/s)."""

    kind: str | None  # "nvlink", "pcie", or None (no GPU, no NVML)
    limit_gbs: float | None
    detail: str
    source: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def link_limit(device_index: int | None, nvml: Any = None) -> LinkInfo:
    """NVLink links up x per-link GB/s by NVLink version; else PCIe lanes x per-lane GB/s; else None, said why."""
    if device_index is None:
        return LinkInfo(None, None, "no CUDA GPU: no link to measure against")
    try:
        nv = nvml
        if nv is None:
            import pynvml as nv
        nv.nvmlInit()
        h = nv.nvmlDeviceGetHandleByIndex(device_index)
    except Exception as e:  # no nvidia-ml-py, no driver, no permission
        return LinkInfo(None, None, f"NVML unavailable: {type(e).__name__}: {e}")
    up, versions = 0, set()
    for link in range(getattr(nv, "NVML_NVLINK_MAX_LINKS", 18)):
        try:
            if nv.nvmlDeviceGetNvLinkState(h, link) == getattr(nv, "NVML_FEATURE_ENABLED", 1):
                up += 1
                versions.add(int(nv.nvmlDeviceGetNvLinkVersion(h, link)))
        except Exception:  # NotSupported past the last link, or no NVLink at all
            continue
    if up:
        v = max(versions)
        per = NVLINK_GBS_PER_LINK.get(v)
        name = NVLINK_NAMES.get(v, f"version {v}")
        if per is None:
            return LinkInfo("nvlink", None, f"{up} NVLink links up, NVML version {v}: not in gpulab's table")
        return LinkInfo("nvlink", up * per, f"{up} NVLink {name} links up x {per:g} GB/s per direction", NVLINK_SOURCE)
    try:
        gen = max(nv.nvmlDeviceGetCurrPcieLinkGeneration(h), nv.nvmlDeviceGetMaxPcieLinkGeneration(h))
        width = max(nv.nvmlDeviceGetCurrPcieLinkWidth(h), nv.nvmlDeviceGetMaxPcieLinkWidth(h))
    except Exception as e:
        return LinkInfo(None, None, f"no NVLink up, and NVML gives no PCIe link: {type(e).__name__}: {e}")
    per = PCIE_GBS_PER_LANE.get(int(gen))
    if per is None:
        return LinkInfo("pcie", None, f"PCIe Gen{gen} x{width}: not in gpulab's table")
    # An idle link trains down to save power: the generation and width it can run at are the limit.
    return LinkInfo("pcie", per * width, f"no NVLink up; PCIe Gen{gen} x{width} at {per:g} GB/s per lane and "
                    "direction (a GPU-to-GPU copy may cross a switch or the CPU, which can be slower)", PCIE_SOURCE)


def bus_bandwidth_gbs(nbytes: float, seconds: float, world_size: int) -> float:
    """All-reduce bus bandwidth as nccl-tests defines it: algbw (bytes / time) x 2(n-1)/n, in GB/s.

    A ring all-reduce moves 2(n-1)/n of the buffer over each GPU's link, so busbw is comparable to the link's
    unidirectional bandwidth whatever the number of ranks (it is 0 for one rank: nothing crosses a link).
    """
    if nbytes <= 0 or seconds <= 0:
        raise ValueError(f"nbytes={nbytes!r} and seconds={seconds!r} must be > 0")
    if not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size={world_size!r} must be an integer >= 1")
    return nbytes / seconds / 1e9 * 2 * (world_size - 1) / world_size
