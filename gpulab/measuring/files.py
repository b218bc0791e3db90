"""Where runs write their files, and writing them atomically: a crash never leaves a half-written file."""
from __future__ import annotations

import json
import math
import os
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any


class JsonRecord:
    """A dataclass that a result file holds: `to_dict` gives every field, `from_dict` takes the fields it knows."""

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Any:
        """An instance from `to_dict`'s dict; keys it does not know (an older or newer file's) are ignored."""
        return cls(**{k: v for k, v in d.items() if k in cls.__dataclass_fields__})


def data_dir() -> Path:
    """The course's data folder: $GPULAB_DATA, or data/ beside the gpulab package."""
    env = os.environ.get("GPULAB_DATA")
    return Path(env) if env else Path(__file__).resolve().parents[2] / "data"


def results_dir() -> Path:
    """Where runs write their results: $GPULAB_RESULTS, or data/results (git-ignored)."""
    env = os.environ.get("GPULAB_RESULTS")
    return _results_from_env(env) if env else data_dir() / "results"


def _results_from_env(env: str) -> Path:
    """$GPULAB_RESULTS, resolved once: a relative path against the folder the shell set it in ($PWD; under Jupyter
    the kernel starts in notebooks/), said in one line; refused inside the committed reference runs."""
    path = Path(env).expanduser()
    if not path.is_absolute():
        start = os.environ.get("PWD", "")
        path = (Path(start) if start and os.path.isdir(start) else Path.cwd()) / path
        os.environ["GPULAB_RESULTS"] = str(path)
        print(f"gpulab: GPULAB_RESULTS={env} is relative: results go to {path}", file=sys.stderr)
    if path.exists() and not path.is_dir():  # found here, where a lesson starts, not at its save
        raise ValueError(f"GPULAB_RESULTS={env} is a file; set it to a folder (or unset it for data/results)")
    reference = (data_dir() / "reference").resolve()
    if path.resolve() == reference or reference in path.resolve().parents:
        raise ValueError(f"GPULAB_RESULTS={env} is inside {reference}: the committed reference runs are never "
                         "overwritten by a run; unset it or choose another folder, e.g. runs/mine")
    return path


def _clean(x: Any) -> Any:
    """JSON-safe: NaN/inf become None, tuples become lists, objects with to_dict are converted."""
    if hasattr(x, "to_dict"):
        return _clean(x.to_dict())
    if isinstance(x, dict):
        return {str(k): _clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_clean(v) for v in x]
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, (str, int, float, bool)) or x is None:
        return x
    return str(x)


TMP_MARK = ".gpulab-tmp-"  # temporary files of atomic writes: <folder>/<name>.gpulab-tmp-<pid>


def _sweep_stale_temps(path: Path) -> None:
    """Remove temporary files that an earlier write of `path` left behind (a process killed mid-write)."""
    for old in path.parent.glob(f"{path.name}{TMP_MARK}*"):
        pid = old.name.rsplit("-", 1)[-1]
        if pid.isdigit() and int(pid) != os.getpid() and pid_alive(int(pid)):
            continue  # another process is writing this file right now: leave its temporary alone
        try:
            old.unlink()
        except OSError:
            pass


def pid_alive(pid: int) -> bool:
    """Whether process `pid` runs (one of another user counts as running)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True


def write_text_atomic(path: Path | str, text: str | bytes) -> Path:
    """Write `text` to `path` via a temporary file beside it and os.replace: a crash never leaves a
    half-written file. The temporary is named `<name>.gpulab-tmp-<pid>` (visible, recognisable), and one left
    by a process killed mid-write is removed by the next write of the same file. Files are created 0644
    (less the umask), like any file the reader creates."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    _sweep_stale_temps(path)
    tmp = path.parent / f"{path.name}{TMP_MARK}{os.getpid()}"
    data = text.encode() if isinstance(text, str) else text
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path


def write_json_atomic(path: Path | str, data: Any) -> Path:
    """Write JSON to `path` atomically (see `write_text_atomic`); NaN and inf are written as null."""
    text = json.dumps(_clean(data), indent=1, allow_nan=False)  # serialise fully before touching the disk
    return write_text_atomic(path, text)


def make_writable(out: Path, name: str = "--out") -> None:
    """Make the folder `out` and write a file there, or raise ValueError in one line: the only sure test (root
    passes os.access everywhere; /proc refuses a folder anyway)."""
    probe = out / f".gpulab-probe-{os.getpid()}"
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe.write_bytes(b"probe")
        probe.unlink()
    except OSError as e:
        raise ValueError(f"{name} {out} cannot be written: {e.strerror or e}"
                         + (f" ({e.filename})" if e.filename else "")) from None
