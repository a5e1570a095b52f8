"""What ``eddyflow run`` shows while a job runs.

On a terminal, a ``rich`` live table redrawn from each metrics sample
(``env.on_metrics``): per operator its records per second in and out and
its back-pressure, and a line with the last checkpoint (id, duration, size,
channel state) and the restarts. Anywhere else (a pipe, a log file, CI) one
plain line per sample, with nothing a terminal would have to interpret.
Both go to stderr: stdout stays the job's.
"""

from __future__ import annotations

from types import TracebackType
from typing import Any, TextIO

from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from eddyflow.runtime.metrics import JobMetrics

__all__ = ["LiveDisplay", "PlainLines", "checkpoint_text", "size_text"]


def size_text(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError


def checkpoint_text(m: JobMetrics) -> str:
    last = m.last_checkpoint
    text = f"checkpoints {m.checkpoints_completed}"
    if m.checkpoints_aborted:
        text += f" ({m.checkpoints_aborted} aborted)"
    if last is not None:
        text += (f", last #{last.id} in {last.duration:.3f} s, "
                 f"{size_text(last.checkpointed_size)}")
        if last.unaligned:
            text += f", unaligned with {size_text(last.channel_state_bytes)} in flight"
    return text + f"; restarts {m.restarts}"


class PlainLines:
    """One line per sample, for a stream that is not a terminal."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream

    def __enter__(self) -> PlainLines:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def update(self, m: JobMetrics) -> None:
        ops = "; ".join(
            f"{uid}: {row['records_in_per_second']:,.0f} in/s "
            f"{row['records_out_per_second']:,.0f} out/s bp {row['backpressure']:.0%}"
            for uid, row in m.by_operator().items())
        print(f"[{m.uptime:6.1f}s] {checkpoint_text(m)} | {ops}", file=self.stream, flush=True)


class LiveDisplay:
    """A table redrawn in place on a terminal."""

    def __init__(self, console: Console, job: str) -> None:
        self.console = console
        self.job = job
        self._live = Live(self._render(None), console=console, auto_refresh=False,
                          transient=False)

    def __enter__(self) -> LiveDisplay:
        self._live.__enter__()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._live.__exit__(exc_type, exc, tb)

    def update(self, m: JobMetrics) -> None:
        self._live.update(self._render(m), refresh=True)

    def _render(self, m: JobMetrics | None) -> Any:
        table = Table(title=f"job '{self.job}'", title_justify="left", expand=False)
        table.add_column("operator")
        table.add_column("in rec/s", justify="right")
        table.add_column("out rec/s", justify="right")
        table.add_column("records in", justify="right")
        table.add_column("back-pressure", justify="right")
        if m is None:
            return Group(table, Text("starting..."))
        for uid, row in m.by_operator().items():
            bp = row["backpressure"]
            style = "red" if bp >= 0.8 else "yellow" if bp >= 0.5 else ""
            table.add_row(uid, f"{row['records_in_per_second']:,.0f}",
                          f"{row['records_out_per_second']:,.0f}",
                          f"{int(row['records_in']):,}", Text(f"{bp:.0%}", style=style))
        return Group(table, Text(f"{m.uptime:.1f} s; {checkpoint_text(m)}"))
