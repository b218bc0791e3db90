"""What can go wrong around a run, each told in one line: a signal that stops it, a full disk, a folder of the
system given as --out, an executed notebook cut mid-write."""
from __future__ import annotations

import contextlib
import errno
import json
import os
from pathlib import Path

from ..measuring.files import write_text_atomic

# Folders of the system itself: a run's files never belong there (`--out /` would scatter them over the root).
SYSTEM_DIRS = ("/", "/bin", "/boot", "/dev", "/etc", "/lib", "/lib64", "/proc", "/run", "/sbin", "/sys", "/usr",
               "/var")
DISK_FULL = (errno.ENOSPC, errno.EDQUOT)


class Stopped(KeyboardInterrupt):
    """The run was stopped by a signal (SIGTERM from a job scheduler or `timeout`): handled like Ctrl-C."""


class DiskFull(OSError):
    """No space left where the run writes: every later notebook would fail the same way, so the run stops."""


def system_folder(out: Path) -> str | None:
    """The system folder `out` is, or lies in where nothing may be made (/proc, /sys), or None."""
    resolved = out.resolve()
    if resolved == Path(resolved.anchor):
        return f"the root of the filesystem ({resolved.anchor})"
    if str(resolved) in SYSTEM_DIRS:
        return str(resolved)
    for pseudo in ("/proc", "/sys"):
        if resolved.is_relative_to(pseudo):
            return f"inside {pseudo}"
    return None




def keep_if_whole(writing: Path, dest: Path) -> None:
    """Move an executed notebook into place if it is whole JSON; remove a cut one (a full disk, a kill mid-write)."""
    try:
        if not writing.exists():
            return
        text = writing.read_text(encoding="utf-8")
        json.loads(text)
        # papermill records where it wrote: the notebook's own name, not the temporary one
        fixed = text.replace(json.dumps(str(writing))[1:-1], json.dumps(str(dest))[1:-1])
        if fixed == text:
            os.replace(writing, dest)
        else:
            write_text_atomic(dest, fixed)
    except ValueError:  # cut JSON: no executed notebook rather than half of one
        pass
    except OSError as e:
        if disk_full(e):
            raise DiskFull(errno.ENOSPC, "no space left on the device writing the executed notebook",
                           str(dest)) from None
    finally:
        with contextlib.suppress(OSError):
            writing.unlink(missing_ok=True)


def disk_full(e: BaseException) -> bool:
    """Whether `e` (or what caused it, or a notebook cell's error) is "no space left on device" or a full quota."""
    seen = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, OSError) and e.errno in DISK_FULL:
            return True
        evalue = str(getattr(e, "evalue", ""))  # a cell's OSError, as papermill reports it
        if any(f"[Errno {n}]" in evalue for n in DISK_FULL) or "No space left on device" in evalue:
            return True
        e = e.__cause__ or e.__context__
    return False


def where(e: BaseException) -> str | None:
    """The file an OSError (or its cause) names, if any."""
    seen = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, OSError) and e.filename:
            return str(e.filename)
        e = e.__cause__ or e.__context__
    return None
