"""The rank side of gpulab.tools.distributed.launch: torchrun starts this module once per rank.

It reads the launch's spec.json, joins the process group (with a timeout), calls the target function with a RankContext, and writes what
the function returned, or its traceback, to <out>/rank<N>.json (atomically), with the rank's monitor trace.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import sys
import time
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="gpulab._rank")
    p.add_argument("spec", type=Path, help="the launch's spec.json (target, backend, kwargs, timeouts)")
    spec_path = p.parse_args(argv).spec
    spec = json.loads(spec_path.read_text())
    out = spec_path.parent

    from .tools.distributed import SAFE_ENV
    os.environ.update(SAFE_ENV)  # also here, before NCCL reads its environment: never NVLink multicast

    rank, world, local = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), int(os.environ["LOCAL_RANK"])
    (out / f"rank{rank}.pid").write_text(str(os.getpid()))  # so a timed-out launch can stop this rank
    report: dict = {"rank": rank, "ok": False, "result": None, "trace": None, "error": "", "traceback": ""}
    t0 = time.perf_counter()
    dist = None
    try:
        import torch
        import torch.distributed as dist

        from .tools.distributed import RankContext, resolve_target
        from .measuring.monitor import Monitor

        if spec["backend"] == "nccl":
            device = torch.device("cuda", local)
            torch.cuda.set_device(device)
        else:
            device = torch.device("cpu")
        timeout = _dt.timedelta(seconds=spec["pg_timeout_s"])
        if spec["backend"] == "nccl":
            dist.init_process_group("nccl", timeout=timeout, device_id=device)
        else:
            dist.init_process_group("gloo", timeout=timeout)
        ctx = RankContext(rank, world, local, spec["backend"], device)
        _, fn = resolve_target(spec["target"])
        kwargs = spec["kwargs"]
        if spec["monitor"]:
            from .measuring.device import get_device

            with Monitor(get_device(local) if device.type == "cuda" else None) as mon:
                result = fn(ctx, **kwargs)
            report["trace"] = mon.trace.to_dict()
        else:
            result = fn(ctx, **kwargs)
        report.update(ok=True, result=result)
    except BaseException as e:  # report every failure with its traceback; the launcher reads it
        from .tools.distributed import format_exception

        report["error"], report["traceback"] = format_exception(e)
    report["seconds"] = time.perf_counter() - t0
    from .measuring.files import write_json_atomic

    write_json_atomic(out / f"rank{rank}.json", report)
    sys.stdout.flush()
    if not report["ok"]:
        # Leave at once: a clean shutdown could wait on ranks that are blocked in a collective with this one.
        os._exit(1)
    if dist is not None and dist.is_initialized():
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
