"""A step tracker's outputs: its StepRecord, the CSV it appends to (and `read_csv` to read it back), TensorBoard
scalars, log lines and the live figure."""
from __future__ import annotations

import csv
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any


CSV_FIELDS = ("step", "steps", "gpu_ms", "host_ms", "items_per_s", "tflops", "mfu", "nvml_util", "gpm_sm_active")
# On a CPU the step's time is the host clock's (the work is synchronous): `step_ms`, no GPU columns.
HOST_CSV_FIELDS = ("step", "steps", "step_ms", "host_ms", "items_per_s", "tflops", "mfu")


@dataclass
class StepRecord:
    """One step as measured (or a window of `steps` steps, per step): GPU time, host time, throughput, TFLOP/s,
    MFU and the monitor's last readings."""

    step: int
    gpu_ms: float
    host_ms: float | None = None
    steps: int = 1
    items_per_s: float | None = None
    tflops: float | None = None
    mfu: float | None = None
    nvml_util: float | None = None
    gpm_sm_active: float | None = None

class TrackerOutputs:
    """What a StepTracker writes as it reads its events (a mixin: it uses the tracker's own fields)."""

    # -- outputs --------------------------------------------------------------------------------------
    def _open_outputs(self) -> None:
        if self.csv_path is not None:
            self.csv_path.parent.mkdir(parents=True, exist_ok=True)
            new = not self.csv_path.exists() or self.csv_path.stat().st_size == 0
            self._csv = open(self.csv_path, "a", newline="")
            self._csv_writer = csv.DictWriter(self._csv, fieldnames=self.csv_fields, extrasaction="ignore")
            if new:
                self._csv_writer.writeheader()
        if self._tb_arg is not None:
            if hasattr(self._tb_arg, "add_scalar"):
                self._writer = self._tb_arg
            else:
                try:
                    from torch.utils.tensorboard import SummaryWriter
                    self._writer = SummaryWriter(str(self._tb_arg))
                except ImportError as e:  # tensorboard is optional
                    self._note(f"TensorBoard logging off: {e} (pip install tensorboard)")

    def _note(self, text: str) -> None:
        self.notes.append(text)
        self.printer(text)

    def _emit(self, new: list[StepRecord]) -> None:
        for r in new:
            if self._csv is not None:
                row = asdict(r)
                row["step_ms"] = row["gpu_ms"]  # the host clock's column name (only written on a CPU)
                self._csv_writer.writerow({k: ("" if v is None else v) for k, v in row.items()})
            if self._writer is not None:
                for k in ("gpu_ms", "items_per_s", "tflops", "mfu", "nvml_util", "gpm_sm_active"):
                    v = getattr(r, k)
                    if v is not None:
                        self._writer.add_scalar(f"tracker/{k}", v, r.step)
            if self.log_every and r.step // self.log_every > (r.step - r.steps) // self.log_every:  # crossed N
                self.printer(self.log_line(r))
        if self._csv is not None:
            self._csv.flush()
        self._flush_outputs(force=False)

    def _flush_outputs(self, force: bool) -> None:
        if not self.plot or not self.records:
            return
        now = self.clock()
        if not force and now - self._last_plot < self.plot_every_s:
            return
        self._last_plot = now
        fig = self.plot(self)
        try:
            from IPython.display import display

            if self._display is None:
                self._display = display(fig, display_id=True)
            else:
                self._display.update(fig)
        except ImportError:
            pass
        import matplotlib.pyplot as plt

        plt.close(fig)  # shown through the display handle only: no second copy at the end of the cell


def _check_csv_header(path: Path, fields_: tuple[str, ...]) -> None:
    """A tracker appends: refuse a file that holds other columns (another kind of tracker's, or not a tracker's)."""
    if not path.is_file() or path.stat().st_size == 0:
        return
    with open(path, newline="") as f:
        header = next(csv.reader(f), [])
    if tuple(header) != fields_:
        raise ValueError(f"csv_path={str(path)!r} holds other columns ({', '.join(header) or 'none'}), not this "
                         f"tracker's ({', '.join(fields_)}): give a new file or delete that one")


def read_csv(path: str | Path) -> list[StepRecord]:
    """The step records a tracker wrote to `path` (empty cells read back as None, a CPU's `step_ms` as `gpu_ms`); a row
    cut short or a value that is not a number raises ValueError naming the file and the line."""
    names = {f.name for f in fields(StepRecord)}
    out = []
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        header = reader.fieldnames or []
        if "step" not in header or not {"gpu_ms", "step_ms"} & set(header):
            raise ValueError(f"{path}: not a step tracker's CSV (its header is {', '.join(header) or 'empty'}; a "
                             f"tracker writes {', '.join(CSV_FIELDS)} or, on a CPU, {', '.join(HOST_CSV_FIELDS)})")
        for row in reader:
            where = f"{path}, line {reader.line_num}"
            if None in row:
                raise ValueError(f"{where}: {len(header) + len(row[None])} values for {len(header)} columns")
            if cut := [k for k, v in row.items() if v is None]:
                raise ValueError(f"{where}: the row is cut short (no {', '.join(cut)}): was the file copied while "
                                 "the tracker wrote it?")
            vals: dict[str, Any] = {}
            for column, v in row.items():
                if (k := "gpu_ms" if column == "step_ms" else column) not in names:
                    continue
                try:
                    vals[k] = int(v) if k in ("step", "steps") else (None if v == "" else float(v))
                except ValueError:
                    raise ValueError(f"{where}: {column}={v!r} is not a number") from None
            if vals.get("gpu_ms") is None:
                raise ValueError(f"{where}: no step time (gpu_ms or step_ms is empty)")
            out.append(StepRecord(**vals))
    return out
