"""Command line: `python -m gpulab info [--measure]`, `check`, `run [--smoke|--full] [NN ...]`, `summary DIR`.

Usage errors (a bad option, parameter, folder or file) print one line naming it and exit 2 before any work.
Ctrl-C exits 130, SIGTERM 143 and SIGHUP 129 (128 + the signal), each after one line; a full disk ends in one
line naming the file, exit 1.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path


def cuda_build_note() -> str | None:
    """One line when this torch is a CUDA build on a machine where no CUDA GPU is usable (the CPU wheel is smaller)."""
    import torch

    if torch.version.cuda is None or torch.cuda.is_available():
        return None
    return (f"torch {torch.__version__} is a CUDA {torch.version.cuda} build and no CUDA GPU is usable here: the CPU "
            "wheel would save about 5 GB of disk (pip install torch --index-url https://download.pytorch.org/whl/cpu)")


def _info(args: argparse.Namespace) -> int:
    from .measuring.device import get_device
    from .measuring.peaks import measure_peaks
    from .measuring.monitor import availability

    dev = get_device()
    avail = availability(dev)
    report = {"device": dev.to_dict(), "monitoring": avail}
    wheel = cuda_build_note()
    if wheel:
        report["note"] = wheel
    if args.measure:
        from .measuring.dtypes import DTYPES
        dtypes = tuple(args.dtypes.split(",")) if args.dtypes else DTYPES
        report["measured"] = measure_peaks(dev, dtypes=dtypes).to_dict()
    if args.json:
        print(json.dumps(report, indent=1))
        return 0
    print(f"device      {dev.name} ({dev.kind})")
    print(f"torch       {dev.torch_version}  CUDA {dev.cuda_version}  driver {dev.driver}  CPU cores {dev.cpu_cores}")
    if dev.cpu and dev.cpu != dev.name:
        print(f"host CPU    {dev.cpu}")
    if dev.is_cuda:
        print(f"            compute capability {dev.capability}, {dev.sm_count} SMs, {dev.memory_gb:.1f} GB")
    if dev.datasheet_peaks:
        peaks = ", ".join(f"{k.upper()} {v:g}" for k, v in dev.datasheet_peaks.tflops.items())
        print(f"datasheet   {dev.datasheet_peaks.model}: {peaks} TFLOP/s (dense); {dev.datasheet_peaks.bandwidth_gbs:g} GB/s")
        print(f"            source: {dev.datasheet_peaks.source}")
    elif dev.note:
        print(f"note        {dev.note}")
    print("monitoring  " + "\n            ".join(f"{k:<18} {v}" for k, v in avail.items()))
    if wheel:
        print(f"note        {wheel}")
    if args.measure:
        m = report["measured"]
        print(f"measured    copy {m['copy_gbs']:,.0f} GB/s (read + write); matmul TFLOP/s, best shape of each search "
              "(best of its rounds, [min, max] of the rounds):")
        for k, v in m["tflops"].items():
            shape = "x".join(str(x) for x in m.get("shape", {}).get(k, [])) or f"{m['matmul_size']}³"
            lo, hi = m.get("interval", {}).get(k, [v, v])
            print(f"            {k.upper():<5} {v:,.1f} [{lo:,.1f}, {hi:,.1f}] at {shape} (MxNxK); "
                  f"{len(m.get('search', {}).get(k, []))} shapes in {m.get('seconds', {}).get(k, 0):.0f} s")
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

    from .app.course import run_course
    from .verdicts.params import boolean, parse_value

    params: dict = {}
    for name, value in args.param or []:
        if name in params:
            raise ValueError(f"-p {name} is given twice ({params[name]!r} and {parse_value(value)!r}): give each "
                             "parameter once")
        params[name] = parse_value(value)
    smoke, why = choose_smoke(args.smoke, args.full, torch.cuda.is_available())
    if "SMOKE" in params:
        if args.smoke or args.full:
            raise ValueError("-p SMOKE contradicts --smoke/--full: use one of them")
        smoke, why = boolean()("SMOKE", params.pop("SMOKE")), None
    if why:
        print(why, file=sys.stderr)
    with _SigtermStopsTheRun():
        course = run_course(args.notebooks, smoke=smoke, out=args.out, compare=args.compare,
                            timeout_s=args.timeout, parameters=params, html=args.html, show_all=args.all,
                            as_reference=args.as_reference)
    for r in course.runs:
        status = "ok  " if r.ok else "FAIL"
        print(f"{status} {r.notebook:<22} {r.seconds:6.1f} s  {r.output}" + (f"\n     {r.error}" if r.error else ""))
    if course.runs:  # the summary's wall (s) is the lesson's own time, from its first cell to its save
        print("(seconds per notebook: kernel start to end, papermill's writing included)")
    for problem in course.problems:  # what the summary lists under Problems shows here too
        print(f"problem: {problem}", file=sys.stderr)
    print(f"summary: {course.summary_md}\n         {course.summary_png}")
    if course.interrupted:
        how = "interrupted" if course.stopped_by == "Ctrl-C" else f"stopped by {course.stopped_by or 'a signal'}"
        print(f"gpulab: {how}; the summary holds the {len(course.runs)} notebook(s) that finished",
              file=sys.stderr)
        return _exit_code(course.stopped_by)
    return 0 if course.ok else 1


def _exit_code(stopped_by: str) -> int:
    """128 + the signal's number, as a shell reports a process it stopped: 130 for Ctrl-C, 143 for SIGTERM, 129 for
    SIGHUP."""
    import signal

    name = "SIGINT" if stopped_by in ("", "Ctrl-C") else stopped_by
    return 128 + int(getattr(signal, name, signal.SIGINT))


class _SigtermStopsTheRun:
    """While a run goes, SIGTERM (a job scheduler, `timeout`) and SIGHUP (a closed terminal, a dropped ssh session)
    are handled like Ctrl-C: they raise `Stopped` in the main thread, so the runner writes the summary of what
    finished and removes its lock. Off the main thread, where no handler can be set, they are left as they are."""

    def __enter__(self) -> None:
        import signal

        self.previous = {}
        for sig in (signal.SIGTERM, getattr(signal, "SIGHUP", None)):
            try:
                if sig is not None:
                    self.previous[sig] = signal.signal(sig, self._stop)
            except ValueError:  # not the main thread
                pass

    def __exit__(self, *exc: object) -> None:
        import signal

        for sig, previous in self.previous.items():
            signal.signal(sig, previous)

    @staticmethod
    def _stop(signum: int, frame: object) -> None:
        import signal

        from .app.faults import Stopped

        raise Stopped(signal.Signals(signum).name)


def _summary(args: argparse.Namespace) -> int:
    from .app.readme import update_readme
    from .app.run_folders import check_out_dir, check_reference_dir, check_summary_target
    from .app.summary import RESULT_GLOB
    from .app.summary_page import write_summary

    folder = args.results
    if not folder.exists():
        raise ValueError(f"{folder}: no such folder")
    if not folder.is_dir():
        raise ValueError(f"{folder} is a file; give the folder that holds the result files (NN_name.json)")
    if not any(folder.glob(RESULT_GLOB)):
        raise ValueError(f"{folder} holds no result files (NN_name.json); a run keeps them in "
                         "<run folder>/results/<gpu>/")
    check_reference_dir(folder, "summary")  # none of its files loads: say so, write no empty summary
    compare = check_reference_dir(args.compare)
    out = check_out_dir(args.out) if args.out is not None else folder
    check_summary_target(out)
    if args.readme:  # refuse a smoke or CPU run, or a README without the section, before writing anything
        from .app.readme import README_MARKERS, check_reference_results
        from .app.summary import collect
        if not args.readme.is_file() or README_MARKERS[0] not in args.readme.read_text(errors="replace"):
            raise ValueError(f"--readme {args.readme}: not a README with a reference section (a file holding "
                             f"{README_MARKERS[0]} ... {README_MARKERS[1]})")
        check_reference_results(collect(folder)[0], folder)
    md, png = write_summary(folder, out, compare=compare)
    print(md.read_text())
    print(f"figure: {png}")
    if args.readme:
        print(f"reference section updated: {update_readme(args.readme, folder)}")
    return 0


def _check(args: argparse.Namespace) -> int:
    import torch

    from .app.selfcheck import print_check, run_check

    from .measuring.files import results_dir

    folder = results_dir()
    parent = folder
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
        raise ValueError(f"{folder} cannot be written ({parent} is read-only or not a folder): the check saves its measured peaks "
                         "there; make it writable or set GPULAB_RESULTS to a writable folder")
    smoke, why = choose_smoke(args.smoke, args.full, torch.cuda.is_available())
    for line in (why, cuda_build_note()):
        if line:
            print(line, file=sys.stderr)
    print_check(run_check(smoke=smoke, progress=True))
    return 0


def _timeout(text: str) -> int:
    """--timeout: whole seconds > 0 (leave it out for no limit)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not whole seconds > 0") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{value} must be > 0 seconds (leave --timeout out for no limit)")
    return value


def _folder(text: str) -> Path:
    if not text.strip():
        raise argparse.ArgumentTypeError("is empty; give a folder")
    return Path(text)


def _first_line(obj: object) -> str:
    import inspect

    doc = inspect.getdoc(obj) or ""
    return doc.strip().split("\n\n")[0].replace("\n", " ").strip()


def _signature(obj: object) -> str:
    import inspect

    try:
        sig = str(inspect.signature(obj))
    except (TypeError, ValueError):
        return ""
    return sig if len(sig) <= 70 else "(...)"


def _members(cls: type) -> list[tuple[str, object]]:
    out = []
    inherited = {k: v for base in cls.__mro__[1:] if base.__module__.startswith("gpulab.")
                 for k, v in vars(base).items()}
    for name, attr in (vars(cls) | {k: v for k, v in inherited.items() if k not in vars(cls)}).items():
        if name.startswith("_"):
            continue
        if isinstance(attr, property):
            out.append((name, attr.fget))
        elif isinstance(attr, (classmethod, staticmethod)):
            out.append((name + "()", attr.__func__))
        elif callable(attr) or hasattr(attr, "func"):  # a method, or a cached_property
            out.append((name + ("()" if callable(attr) else ""), getattr(attr, "func", attr)))
    return out


def api_markdown() -> str:
    """docs/API.md: every public name of gpulab with the first line of its docstring (`gpulab api` prints it)."""
    import inspect

    import gpulab as gl
    from .measuring.monitor import METRICS

    lines = ["# gpulab API", "",
             "Every public name, with the first line of its docstring. Generated by `python -m gpulab api > "
             "docs/API.md`; a test compares this file with the code, so it stays true. `import gpulab as gl`; "
             "the details are in each docstring (`help(gl.benchmark)`).", "",
             "Install: `pip install -e .`; the optional extras are `course` (JupyterLab, papermill), `test`, and "
             "`tensorboard` (`pip install -e .[tensorboard]`: `gl.track(tensorboard=...)` writes TensorBoard "
             "scalars; without it, use `csv_path=` and `gl.read_csv`).", "",
             "## Top level", ""]
    modules = []
    for name in gl.__all__:
        obj = getattr(gl, name)
        if inspect.ismodule(obj):
            modules.append((name, obj))
            continue
        if inspect.isclass(obj):
            lines.append(f"- `gl.{name}`: {_first_line(obj)}")
            lines += [f"  - `.{m}`: {_first_line(f)}" for m, f in _members(obj)]
        else:
            lines.append(f"- `gl.{name}{_signature(obj)}`: {_first_line(obj)}")
    for name, mod in modules:
        lines += ["", f"## gl.{name}", "", _first_line(mod), ""]
        for fname, f in sorted(vars(mod).items()):
            if fname.startswith("_") or not inspect.isfunction(f) or f.__module__ != mod.__name__:
                continue
            lines.append(f"- `gl.{name}.{fname}{_signature(f)}`: {_first_line(f)}")
    lines += ["", "## Monitor metrics", "",
              "The names `gl.Monitor`'s trace records (`trace.values(name)`, `trace.mean(name)`, "
              "`gl.plots.timeline(..., metrics=[...])`); a metric this machine cannot read is in "
              "`trace.missing()` with the reason.", ""]
    lines += [f"- `{k}`: {v}" for k, v in METRICS.items()]
    lines += ["", "## Command line", "",
              "- `python -m gpulab --version`: the version.",
              "- `python -m gpulab info [--measure [--dtypes bf16,...]] [--json]`: this machine, its datasheet "
              "peaks and what can be monitored; `--measure` adds each dtype's best matmul shape and rate.",
              "- `python -m gpulab check`: a quick self-check of the measuring tools on this machine.",
              "- `python -m gpulab run [--smoke|--full] [NN ...] [--out DIR] [-p NAME VALUE]`: run notebooks "
              "headless and write a summary.",
              "- `python -m gpulab summary DIR`: summary.md and summary.png from result files.",
              "- `python -m gpulab api`: this page.", ""]
    return "\n".join(lines)


def _api(args: argparse.Namespace) -> int:
    print(api_markdown(), end="")
    return 0


def main(argv: list[str] | None = None) -> int:
    from . import __version__

    parser = argparse.ArgumentParser(prog="gpulab", description="GPU utilization course helpers")
    parser.add_argument("--version", action="version", version=f"gpulab {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("info", help="the device, its datasheet peaks and what monitoring works")
    p.add_argument("--measure", action="store_true", help="also measure matmul TFLOP/s (a shape search per dtype, as "
                   "mamf-finder does) and copy bandwidth")
    p.add_argument("--dtypes", default="", help="with --measure: comma-separated dtypes to search (default: all), "
                   "e.g. bf16,fp8")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=_info)
    p = sub.add_parser("check", help="check peaks, monitor readings and monitor overhead; saves 00_device.json")
    size = p.add_mutually_exclusive_group()
    size.add_argument("--smoke", action="store_true", help="small sizes (the default without a CUDA GPU)")
    size.add_argument("--full", action="store_true", help="full sizes even without a CUDA GPU (minutes on a CPU)")
    p.set_defaults(func=_check)
    p = sub.add_parser("run", help="run the notebooks headless and summarise what they measured")
    p.add_argument("notebooks", nargs="*", help="numbers or names (default: all, in order)")
    size = p.add_mutually_exclusive_group()
    size.add_argument("--smoke", action="store_true", help="small sizes: minutes on a CPU-only machine "
                      "(the default there)")
    size.add_argument("--full", action="store_true", help="full sizes even without a CUDA GPU (slow on a CPU)")
    p.add_argument("--out", type=_folder, help="folder for executed notebooks, their results and the summary "
                   "(default runs/<date-time>; never under notebooks/)")
    p.add_argument("--compare", type=_folder, help="a reference folder, e.g. data/reference/nvidia-h200 (a CPU-only "
                   "run's summary shows that one, the reference GPU's, without it)")
    p.add_argument("--timeout", type=_timeout, default=None, help="seconds allowed per notebook cell (default: no "
                   "limit)")
    p.add_argument("-p", "--param", nargs=2, action="append", metavar=("NAME", "VALUE"),
                   help="a notebook parameter, e.g. -p BIG_N 2048 or -p DTYPES \"['bf16', 'fp16']\"; values are read "
                   "as Python (True, None, 0.5), checked against each notebook's schema before anything runs")
    p.add_argument("--html", action="store_true", help="also write each executed notebook as HTML beside it")
    p.add_argument("--all", action="store_true", help="summarise the latest result of every notebook "
                   "(data/results/<gpu>/, each with its date), not only this run's")
    p.add_argument("--as-reference", action="store_true", help="this run becomes the reference GPU's reference "
                   "(full sizes, on that GPU only): its pages show no older reference beside them")
    p.set_defaults(func=_run)
    p = sub.add_parser("summary", help="summary.md and summary.png from a folder of result JSON files")
    p.add_argument("results", type=_folder, help="a folder of result files, e.g. runs/<date-time>/results/<gpu>")
    p.add_argument("--out", type=_folder, help="where summary.md and summary.png go (default: the results folder)")
    p.add_argument("--compare", type=_folder, help="a reference folder to show beside (a CPU-only run's results: "
                   "the reference GPU's, data/reference/nvidia-h200, without it)")
    p.add_argument("--readme", type=Path, help="also rewrite this README's reference section from the results "
                   "(between <!-- reference-summary --> markers)")
    p.set_defaults(func=_summary)
    p = sub.add_parser("api", help="print docs/API.md: every public name with its one-line docstring")
    p.set_defaults(func=_api)
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except ValueError as e:
        print(f"gpulab: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as e:  # before or after the notebooks (the runner handles it while they run)
        from .app.faults import Stopped

        how = f"stopped by {e}" if isinstance(e, Stopped) else "interrupted (Ctrl-C)"
        print(f"gpulab: {how}", file=sys.stderr)
        return _exit_code(str(e) if isinstance(e, Stopped) else "Ctrl-C")
    except OSError as e:  # a full disk, a folder gone mid-run: one line naming the file, not a traceback
        import errno

        where = f": {e.filename}" if e.filename else ""
        if e.errno in (errno.ENOSPC, errno.EDQUOT):
            elsewhere = " (or give --out on another disk)" if "out" in vars(args) else ""  # `api` has no --out
            print(f"gpulab: {e.strerror}{where}; free some space{elsewhere} and run again", file=sys.stderr)
        else:
            print(f"gpulab: {e.strerror or e}{where}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
