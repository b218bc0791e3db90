"""Command line: `python -m gpulab info [--measure]`, `check`, `run [--smoke|--full] [NN ...]`, `summary DIR`."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def _info(args: argparse.Namespace) -> int:
    from .device import get_device, measure_peaks
    from .monitor import availability

    dev = get_device()
    avail = availability(dev)
    report = {"device": dev.to_dict(), "monitoring": avail}
    if args.measure:
        report["measured"] = measure_peaks(dev).to_dict()
    if args.json:
        print(json.dumps(report, indent=1))
        return 0
    print(f"device      {dev.name} ({dev.kind})")
    print(f"torch       {dev.torch_version}  CUDA {dev.cuda_version}  driver {dev.driver}  CPU cores {dev.cpu_cores}")
    if dev.is_cuda:
        print(f"            compute capability {dev.capability}, {dev.sm_count} SMs, {dev.memory_gb:.1f} GB")
    if dev.peaks:
        peaks = ", ".join(f"{k.upper()} {v:g}" for k, v in dev.peaks.tflops.items())
        print(f"datasheet   {dev.peaks.model}: {peaks} TFLOP/s (dense); {dev.peaks.bandwidth_gbs:g} GB/s")
        print(f"            source: {dev.peaks.source}")
    elif dev.note:
        print(f"note        {dev.note}")
    print("monitoring  " + "\n            ".join(f"{k:<18} {v}" for k, v in avail.items()))
    if args.measure:
        m = report["measured"]
        print("measured    " + ", ".join(f"{k.upper()} {v:,.1f}" for k, v in m["tflops"].items())
              + f" TFLOP/s ({m['matmul_size']}³ matmul); copy {m['copy_gbs']:,.0f} GB/s (read + write)")
        for n in m["notes"]:
            print(f"            {n}")
    return 0


def choose_smoke(smoke: bool, full: bool, has_cuda: bool) -> tuple[bool, str | None]:
    """Smoke sizes when asked, or by default without a CUDA GPU (full sizes take long on a CPU); and why."""
    if smoke or full or has_cuda:
        return smoke, None
    return True, ("no CUDA GPU here: running at smoke sizes (the same experiments, small and quick); "
                  "add --full for the full sizes")


def _run(args: argparse.Namespace) -> int:
    import torch

    from .course import run_course

    smoke, why = choose_smoke(args.smoke, args.full, torch.cuda.is_available())
    if why:
        print(why, file=sys.stderr)
    course = run_course(args.notebooks, smoke=smoke, out=args.out, compare=args.compare,
                        timeout_s=args.timeout)
    for r in course.runs:
        status = "ok  " if r.ok else "FAIL"
        print(f"{status} {r.notebook:<22} {r.seconds:6.1f} s  {r.output}" + (f"\n     {r.error}" if r.error else ""))
    print(f"summary: {course.summary_md}\n         {course.summary_png}")
    return 0 if course.ok else 1


def _summary(args: argparse.Namespace) -> int:
    from .course import update_readme, write_summary

    md, png = write_summary(args.results, args.out or args.results, compare=args.compare)
    print(md.read_text())
    print(f"figure: {png}")
    if args.readme:
        print(f"reference section updated: {update_readme(args.readme, args.results)}")
    return 0


def _check(args: argparse.Namespace) -> int:
    from .selfcheck import print_check, run_check

    print_check(run_check(smoke=args.smoke))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gpulab", description="GPU utilization course helpers")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("info", help="the device, its datasheet peaks and what monitoring works")
    p.add_argument("--measure", action="store_true", help="also measure matmul TFLOP/s and copy bandwidth")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=_info)
    p = sub.add_parser("check", help="check peaks, monitor readings and monitor overhead; saves 00_device.json")
    p.add_argument("--smoke", action="store_true", help="small sizes")
    p.set_defaults(func=_check)
    p = sub.add_parser("run", help="run the notebooks headless and summarise what they measured")
    p.add_argument("notebooks", nargs="*", help="numbers or names (default: all, in order)")
    size = p.add_mutually_exclusive_group()
    size.add_argument("--smoke", action="store_true", help="small sizes: minutes on a CPU-only machine "
                      "(the default there)")
    size.add_argument("--full", action="store_true", help="full sizes even without a CUDA GPU (slow on a CPU)")
    p.add_argument("--out", type=Path, help="folder for executed notebooks and the summary (default runs/<time>)")
    p.add_argument("--compare", type=Path, help="a reference folder, e.g. data/reference/nvidia-h100-80gb-hbm3")
    p.add_argument("--timeout", type=int, default=None, help="seconds allowed per notebook cell")
    p.set_defaults(func=_run)
    p = sub.add_parser("summary", help="summary.md and summary.png from a folder of result JSON files")
    p.add_argument("results", type=Path)
    p.add_argument("--out", type=Path)
    p.add_argument("--compare", type=Path)
    p.add_argument("--readme", type=Path, help="also rewrite this README's reference section from the results "
                   "(between <!-- reference-summary --> markers)")
    p.set_defaults(func=_summary)
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except ValueError as e:
        print(f"gpulab: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
