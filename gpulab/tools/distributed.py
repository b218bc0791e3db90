"""Run a function of a gpulab module on N ranks through PyTorch's own launcher (torchrun), from a notebook.

    run = launch("multi_gpu_worker.py:allreduce_rank", nproc=2, backend="nccl", kwargs={"sizes": [2**20]})
    run.results          # what each rank's function returned, rank 0 first
    run.traces           # each rank's monitor Trace (NVML on a GPU)
    run                  # a table: rank, status, seconds, error

Each rank (`gpulab._rank`) calls `fn(ctx, **kwargs)` with a `RankContext` after `init_process_group`, and writes
what it returned, or its traceback, as JSON that `launch` reads back. Nothing hangs: the process group and the
launch both time out. NVLink multicast (NVLS) is off in every launch (`SAFE_ENV`): on a shared host it can take
the GPUs out of service."""
from __future__ import annotations

import datetime as _dt
import html
import importlib
import importlib.util
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import traceback as _tb
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ..measuring.monitor import Trace
from ..measuring.files import write_json_atomic

BACKENDS = ("nccl", "gloo")
# Always set in a launch, whatever the caller's environment says: no NVLink multicast, in NCCL (NVLS),
# in PyTorch's symmetric memory, or in NVSHMEM.
SAFE_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
PACKAGE_ROOT = Path(__file__).resolve().parents[2]  # the folder holding gpulab/, put first on the ranks' path


@dataclass
class RankContext:
    """What a rank's function knows about itself: its rank, the world, its device and backend."""

    rank: int
    world_size: int
    local_rank: int
    backend: str
    device: torch.device

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def barrier(self) -> None:
        """Wait for every rank (on a GPU, through the rank's own device)."""
        import torch.distributed as dist

        if self.backend == "nccl":
            dist.barrier(device_ids=[self.local_rank])
        else:
            dist.barrier()

    def synchronize(self) -> None:
        """Wait for this rank's queued GPU work (nothing to wait for on a CPU)."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)


@dataclass
class RankOutcome:
    """How one rank ended: its result, or its error and traceback; its monitor trace; its time."""

    rank: int
    ok: bool
    result: Any = None
    trace: Trace | None = None
    error: str = ""
    traceback: str = ""
    seconds: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"rank": self.rank, "ok": self.ok, "result": self.result,
                "trace": self.trace.to_dict() if self.trace else None, "error": self.error,
                "traceback": self.traceback, "seconds": self.seconds}


class DistributedError(RuntimeError):
    """A launch that failed: one or more ranks raised, died or ran out of time. `.run` holds the details."""

    def __init__(self, run: DistributedRun):
        self.run = run
        super().__init__(run.failure_report())


@dataclass
class DistributedRun:
    """One torchrun launch: the command, its exit status, and every rank's outcome."""

    target: str
    nproc: int
    backend: str
    command: list[str]
    returncode: int | None
    timed_out: bool
    wall_s: float
    ranks: list[RankOutcome] = field(default_factory=list)
    log_tail: str = ""
    safe_env: dict[str, str] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out and all(r.ok for r in self.ranks)

    @property
    def results(self) -> list[Any]:
        """Each rank's return value, rank 0 first (raises DistributedError when a rank failed)."""
        self.raise_for_failures()
        return [r.result for r in self.ranks]

    @property
    def traces(self) -> list[Trace | None]:
        return [r.trace for r in self.ranks]

    @property
    def failures(self) -> list[RankOutcome]:
        return [r for r in self.ranks if not r.ok]

    def failure_report(self) -> str:
        """Which ranks failed and why, each with its traceback's last lines."""
        head = f"{self.target} on {self.nproc} rank(s) ({self.backend})"
        if self.timed_out:
            head += f": stopped after the launch timeout ({self.wall_s:.0f} s)"
        elif self.returncode:
            head += f": torchrun exited with status {self.returncode}"
        lines = [head]
        for r in self.failures:
            lines.append(f"rank {r.rank}: {r.error}")
            if r.traceback:
                lines += ["    " + x for x in r.traceback.strip().splitlines()[-8:]]
        if not any(r.traceback for r in self.failures) and self.log_tail:
            lines += ["launcher output (last lines):"] + ["    " + x for x in self.log_tail.splitlines()[-15:]]
        return "\n".join(lines)

    def raise_for_failures(self) -> DistributedRun:
        if not self.ok:
            raise DistributedError(self)
        return self

    def to_dict(self) -> dict[str, Any]:
        return {"target": self.target, "nproc": self.nproc, "backend": self.backend, "command": self.command,
                "returncode": self.returncode, "timed_out": self.timed_out, "wall_s": self.wall_s,
                "safe_env": self.safe_env, "ranks": [r.to_dict() for r in self.ranks]}

    def _rows(self) -> list[tuple[str, str, str, str]]:
        return [(str(r.rank), "ok" if r.ok else "FAILED", "—" if r.seconds is None else f"{r.seconds:.1f} s",
                 r.error) for r in self.ranks]

    def __repr__(self) -> str:
        status = "ok" if self.ok else ("timed out" if self.timed_out else "FAILED")
        lines = [f"DistributedRun({self.target}, {self.nproc} x {self.backend}: {status}, {self.wall_s:.1f} s)"]
        lines += [f"  rank {a:>2}  {b:<7} {c:>8}  {d}" for a, b, c, d in self._rows()]
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        e = html.escape
        status = "ok" if self.ok else ("timed out" if self.timed_out else "FAILED")
        body = "".join(f"<tr><td>{a}</td><td>{b}</td><td>{c}</td><td style='text-align:left'>{e(d)}</td></tr>"
                       for a, b, c, d in self._rows())
        return (f"<div><b>{e(self.target)}</b> on {self.nproc} rank(s), {self.backend}: <b>{status}</b> "
                f"in {self.wall_s:.1f} s (torchrun included)<table><tr><th>rank</th><th>status</th><th>time</th>"
                f"<th>error</th></tr>{body}</table></div>")


# ---------------------------------------------------------------- before launching

def cuda_device_count() -> int:
    """CUDA GPUs visible to this process (0 without CUDA)."""
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def choose_backend(backend: str = "auto", nproc: int | None = None, *, cuda_count: int | None = None
                   ) -> tuple[str, int]:
    """(backend, nproc): "auto" picks NCCL on every visible GPU when there are two or more, else 2 gloo processes."""
    cuda_count = cuda_device_count() if cuda_count is None else cuda_count
    if backend == "auto":
        backend = "nccl" if cuda_count >= 2 else "gloo"
    if nproc is None:
        nproc = cuda_count if backend == "nccl" else 2
    check_launch(nproc, backend, cuda_count=cuda_count)
    return backend, nproc


def check_launch(nproc: int, backend: str, *, cuda_count: int | None = None) -> None:
    """Raise ValueError, naming the parameter and what is allowed, for a launch that cannot work."""
    if not isinstance(nproc, int) or isinstance(nproc, bool) or nproc < 1:
        raise ValueError(f"nproc={nproc!r} must be an integer >= 1")
    if backend not in BACKENDS:
        raise ValueError(f"backend={backend!r} is not supported; allowed: {', '.join(BACKENDS)} (or 'auto')")
    cuda_count = cuda_device_count() if cuda_count is None else cuda_count
    if backend == "nccl" and nproc > cuda_count:
        raise ValueError(f"backend='nccl' with nproc={nproc} needs {nproc} CUDA GPUs, but {cuda_count} are visible; "
                         "use backend='gloo' (CPU processes) or a smaller nproc")


def resolve_target(target: str):
    """The function named by "gpulab.module:function" (or "module:function" inside gpulab), or by
    "path/to/file.py:function" (a file a notebook wrote, e.g. with %%writefile)."""
    if not isinstance(target, str) or target.count(":") != 1:
        raise ValueError(f"target={target!r} must look like 'gpulab.lessons.multi_gpu:fn' or 'worker.py:fn'")
    module, name = target.split(":")
    try:
        if module.endswith(".py"):
            path = Path(module).resolve()
            spec = importlib.util.spec_from_file_location(path.stem, path)
            if spec is None or not path.exists():
                raise ImportError(f"no such file: {path}")
            mod = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(mod)
            module = str(path)
        else:
            module = module if module.startswith("gpulab.") else f"gpulab.{module}"
            mod = importlib.import_module(module)
        fn = getattr(mod, name)
    except (ImportError, AttributeError) as e:
        raise ValueError(f"target={target!r}: {type(e).__name__}: {e}") from None
    if not callable(fn):
        raise ValueError(f"target={target!r} is not callable")
    return f"{module}:{name}", fn


def launch_env(base: dict[str, str] | None = None, *, nproc: int = 1, backend: str = "gloo") -> dict[str, str]:
    """The environment for torchrun: `base` (default os.environ), gpulab first on the path, SAFE_ENV always."""
    env = dict(os.environ if base is None else base)
    env["PYTHONPATH"] = os.pathsep.join([str(PACKAGE_ROOT)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    if backend == "gloo":  # CPU ranks share the cores: one rank per core's worth of threads, at least one
        env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // nproc)))
    env.setdefault("PYTHONUNBUFFERED", "1")
    env.update(SAFE_ENV)  # last: no caller value can turn NVLink multicast back on
    return env


def torchrun_command(spec_path: Path | str, *, nproc: int) -> list[str]:
    """The torchrun command line that starts gpulab._rank on `nproc` ranks with the launch's spec file.

    The rank reads everything else (target, backend, timeouts, kwargs) from the spec: torchrun's own parser
    would otherwise take an option such as --monitor for an abbreviation of one of its own.
    """
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes", "1",
            "--nproc-per-node", str(nproc), "--max-restarts", "0", "-m", "gpulab._rank", str(spec_path)]


# ---------------------------------------------------------------- launching

def _stop(proc: subprocess.Popen, out_dir: Path, grace_s: float = 5.0) -> None:
    """Stop torchrun (it stops its ranks on SIGTERM), then any rank still alive, by the pid it wrote."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        pass
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    for pid_file in out_dir.glob("rank*.pid"):  # ranks run in sessions of their own: stop each one by its pid
        try:
            os.kill(int(pid_file.read_text()), signal.SIGKILL)
        except (ValueError, ProcessLookupError, PermissionError):
            pass


def _read_outcomes(out_dir: Path, nproc: int, timed_out: bool) -> list[RankOutcome]:
    outcomes = []
    for rank in range(nproc):
        path = out_dir / f"rank{rank}.json"
        if not path.exists():
            why = ("no result: stopped by the launch timeout" if timed_out else
                   "no result: the rank was stopped (another rank failed, or it crashed before reporting)")
            outcomes.append(RankOutcome(rank, False, error=why))
            continue
        d = json.loads(path.read_text())
        outcomes.append(RankOutcome(rank, d["ok"], d.get("result"), Trace.from_dict(d["trace"]) if d.get("trace")
                                    else None, d.get("error", ""), d.get("traceback", ""), d.get("seconds")))
    return outcomes


def launch(target: str, *, nproc: int | None = None, backend: str = "auto", kwargs: dict[str, Any] | None = None,
           timeout_s: float = 600, pg_timeout_s: float = 120, monitor: bool = True, check: bool = True,
           env: dict[str, str] | None = None) -> DistributedRun:
    """Run `target(ctx, **kwargs)` on `nproc` ranks under torchrun and collect every rank's outcome.

    `target` is "gpulab.module:function", taking a RankContext and keyword arguments and returning something JSON
    can hold. `nproc` None: every visible GPU with NCCL, or 2 gloo processes; `backend` "auto": NCCL with two or more
    GPUs. `timeout_s` bounds the whole launch (then torchrun and every rank are stopped), `pg_timeout_s` each
    collective. `monitor` records each rank's device; `check` raises DistributedError when a rank failed. SAFE_ENV
    is always added on top of `env`."""
    backend, nproc = choose_backend(backend, nproc)
    if not timeout_s > 0 or not pg_timeout_s > 0:
        raise ValueError(f"timeout_s={timeout_s!r} and pg_timeout_s={pg_timeout_s!r} must be > 0")
    target, _ = resolve_target(target)
    kwargs = dict(kwargs or {})
    run = _launch_once(target, nproc, backend, kwargs, timeout_s, pg_timeout_s, monitor, env)
    if backend == "gloo" and native_abort(run):  # a CPU transport that crashed in C++: once more, and say so
        print(f"{target}: a gloo rank aborted in native code (no Python error); launching it once more")
        run = _launch_once(target, nproc, backend, kwargs, timeout_s, pg_timeout_s, monitor, env)
    if check:
        run.raise_for_failures()
    return run


def native_abort(run: DistributedRun) -> bool:
    """Whether a launch failed only because a rank died of SIGABRT, with no rank reporting a Python error."""
    return (not run.ok and not run.timed_out and "SIGABRT" in run.log_tail
            and all(r.ok or r.error.startswith("no result:") for r in run.ranks))


def _launch_once(target: str, nproc: int, backend: str, kwargs: dict[str, Any], timeout_s: float,
                 pg_timeout_s: float, monitor: bool, env: dict[str, str] | None) -> DistributedRun:
    """One torchrun launch of `target` (see `launch`)."""
    with tempfile.TemporaryDirectory(prefix="gpulab-ranks-") as tmp:
        out_dir = Path(tmp)
        spec = write_json_atomic(out_dir / "spec.json", {"target": target, "backend": backend, "kwargs": kwargs,
                                                         "pg_timeout_s": pg_timeout_s, "monitor": monitor})
        cmd = torchrun_command(spec, nproc=nproc)
        run_env = launch_env(env, nproc=nproc, backend=backend)
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, env=run_env, cwd=str(PACKAGE_ROOT), stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, start_new_session=True)
        timed_out = False
        try:
            log, _ = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
            _stop(proc, out_dir)
            log, _ = proc.communicate()
        run = DistributedRun(target, nproc, backend, cmd, proc.returncode, timed_out, time.perf_counter() - t0,
                             _read_outcomes(out_dir, nproc, timed_out), (log or "")[-6000:],
                             {k: run_env[k] for k in SAFE_ENV})
    return run


# ---------------------------------------------------------------- a first target

def hello(ctx: RankContext, *, fail_rank: int | None = None, sleep_s: float = 0.0) -> dict[str, Any]:
    """All-reduce each rank's number once and say where the rank ran; `fail_rank` raises there, `sleep_s` waits."""
    import torch.distributed as dist

    if sleep_s:
        time.sleep(sleep_s)
    if fail_rank is not None and ctx.rank == fail_rank:
        raise RuntimeError(f"rank {ctx.rank} failed on purpose")
    t = torch.tensor([float(ctx.rank + 1)], device=ctx.device)
    dist.all_reduce(t)
    return {"rank": ctx.rank, "world_size": ctx.world_size, "device": str(ctx.device), "sum": t.item(),
            "pid": os.getpid(), "host": os.uname().nodename,
            "env": {k: os.environ.get(k) for k in SAFE_ENV}, "torch": torch.__version__,
            "time": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")}


def format_exception(e: BaseException) -> tuple[str, str]:
    """(one-line error, full traceback) of an exception, for a rank's report."""
    msg = str(e).strip().splitlines()
    return f"{type(e).__name__}: {msg[0][:300] if msg else ''}", "".join(_tb.format_exception(e))
