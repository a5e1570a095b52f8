"""The ``eddyflow`` command line.

``eddyflow run JOB.py`` runs a job file's ``build(env)`` to completion,
showing its progress live (cli/live.py), and reports what each operator did;
``eddyflow checkpoints DIR`` lists the
completed checkpoints of a checkpoint directory (marking those whose files
do not verify), or shows one; ``eddyflow validate DIR --job JOB.py`` checks
a checkpoint on Spark (cli/validate.py). Errors are one line each, exit 2
for usage and input errors and 1 for a failed job; ``--debug`` shows the
traceback (cli/errors.py).
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import sys
from typing import Any

import click
from rich.console import Console
from rich.table import Table
from rich.text import Text

from eddyflow.checkpoint.listing import CheckpointInfo, list_checkpoints
from eddyflow.checkpoint.storage import CheckpointCorrupted, CheckpointStorage
from eddyflow.cli.errors import FAILED, CliError, EddyflowGroup, job_failed_line
from eddyflow.cli.live import LiveDisplay, PlainLines
from eddyflow.cli.validate import validate_command
from eddyflow.errors import CheckpointFolderInUse, JobFailed, RestoreFailed
from eddyflow.jobfile import JobFileError, build_environment
from eddyflow.result import JobResult

__all__ = ["main"]


@click.group(cls=EddyflowGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="eddyflow")
def main() -> None:
    """eddyflow: exactly-once stream processing on asyncio."""


def format_result(result: JobResult) -> str:
    ops = list(dict.fromkeys([*result.records_in, *result.records_out]))
    width = max([len("operator"), *map(len, ops)])
    lines = [f"{'operator':<{width}}  {'records in':>12}  {'records out':>12}"]
    for op in ops:
        lines.append(f"{op:<{width}}  {result.records_in.get(op, 0):>12,}  "
                     f"{result.records_out.get(op, 0):>12,}")
    lines.append(f"job '{result.job_name}' finished in {result.duration:.3f} s; "
                 f"{len(result.completed_checkpoints)} checkpoints, {result.restarts} restarts")
    return "\n".join(lines)


@main.command()
@click.argument("job", type=click.Path(dir_okay=False))
@click.option("--restore", default=None, metavar="latest|PATH",
              help="Resume from the latest checkpoint or from a chk-<n> folder.")
@click.option("--parallelism", "-p", type=click.IntRange(min=1), default=None,
              help="Default parallelism of the job's operators.")
@click.option("--workers", default=None, metavar="N|auto",
              help="Worker processes that run the job's subtasks (auto: one per CPU; "
                   "default 1: this process).")
@click.option("--name", default=None, help="Job name (default: the file's name).")
@click.option("--allow-non-restored-state", is_flag=True,
              help="Restore even if the checkpoint holds state no operator of the job "
                   "matches (by name and kind): drop that state, with a warning.")
@click.option("--quiet", "-q", is_flag=True,
              help="No live display while the job runs (the final table only).")
@click.option("--every", type=click.FloatRange(min=0.05), default=1.0, show_default=True,
              help="Seconds between updates of the live display.")
def run(job: str, restore: str | None, parallelism: int | None, workers: str | None,
        name: str | None, allow_non_restored_state: bool, quiet: bool, every: float) -> None:
    """Run JOB.py, a file that defines build(env).

    While it runs, stderr shows records/s and back-pressure per operator,
    the last checkpoint and the restarts: redrawn in place on a terminal,
    one line per update otherwise."""
    options: dict[str, Any] = {} if parallelism is None else {"parallelism": parallelism}
    if workers is not None:
        options["workers"] = "auto" if workers == "auto" else _workers(workers)
    try:
        env, _ = build_environment(job, **options)
    except JobFileError as exc:  # missing, syntax or import error, build(env) raised
        raise CliError(str(exc)) from exc
    except (TypeError, ValueError) as exc:  # an option the environment refuses
        raise CliError(f"invalid job {job}: {exc}") from exc
    job_name = name or os.path.splitext(os.path.basename(job))[0]
    display: contextlib.AbstractContextManager[Any] = contextlib.nullcontext()
    if not quiet:
        console = Console(stderr=True)
        shown: LiveDisplay | PlainLines = (
            LiveDisplay(console, job_name) if console.is_terminal else PlainLines(sys.stderr))
        env.on_metrics(shown.update, every=every)
        display = shown
    try:
        with display:
            result = env.execute(job_name, restore=restore,
                                 allow_non_restored_state=allow_non_restored_state)
    except JobFailed as exc:
        raise CliError(job_failed_line(exc), FAILED) from exc
    except (ValueError, RestoreFailed, CheckpointFolderInUse) as exc:
        # A restore refused or that does not fit the job, a bad option, the
        # checkpoint folder of another live job: input to fix, not a failure.
        raise CliError(f"cannot run job '{job_name}': {exc}") from exc
    click.echo(format_result(result), err=True)


def _workers(text: str) -> int:
    """``--workers``: a positive count (or ``auto``, handled by the caller)."""
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise CliError(f"--workers must be a positive integer or 'auto', got {text!r}")
    return n


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024  # type: ignore[assignment]
    raise AssertionError


def _operator_summary(info: CheckpointInfo) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    if not info.metadata:
        return out  # its metadata could not be read
    for uid, op in info.meta.operators.items():
        handles = [part.keyed for part in op.subtasks.values() if part.keyed is not None]
        out[uid] = {"kind": op.kind, "parallelism": op.parallelism,
                    "state_entries": sum(h.entries for h in handles),
                    "state_bytes": sum(f.size for h in handles for f in h.file_handles())}
    return out


def _as_json(info: CheckpointInfo) -> dict[str, Any]:
    return {
        "id": info.id, "path": info.path, "completed_at": info.completed_at,
        "duration": info.duration, "alignment_duration": info.alignment_duration,
        "checkpointed_size": info.checkpointed_size, "full_size": info.full_size,
        "final": info.final, "verified": info.verified, "problem": info.problem,
        "operators": _operator_summary(info),
    }


@main.command()
@click.argument("directory", type=click.Path(file_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.option("--show", type=int, default=None, metavar="N",
              help="Print the metadata of checkpoint N.")
def checkpoints(directory: str, as_json: bool, show: int | None) -> None:
    """List the completed checkpoints in DIRECTORY (oldest first), checking
    each one's files against its metadata."""
    if not os.path.isdir(directory):
        raise CliError(f"{directory!r} is not a directory")
    if show is not None:
        storage = CheckpointStorage(directory)
        completed = storage.completed_ids()
        if show not in completed:
            known = ", ".join(map(str, completed)) or "none"
            raise CliError(f"no completed checkpoint {show} in {directory} (completed: {known})")
        try:
            meta = storage.read_metadata(show)
        except CheckpointCorrupted as exc:
            raise CliError(f"checkpoint {show} in {directory} is damaged: {exc}") from exc
        click.echo(json.dumps(meta, indent=2, sort_keys=True))
        return
    # Verified: a checkpoint whose files do not match its metadata, or
    # whose metadata cannot be read, is listed as such (recovery skips it).
    infos = list_checkpoints(directory, verify=True)
    if as_json:
        click.echo(json.dumps([_as_json(i) for i in infos], indent=2))
        return
    console = Console(soft_wrap=True)  # a message is one line, whatever the width
    if not infos:
        console.print(f"no completed checkpoints in {directory}")
        return
    table = Table(title=f"checkpoints in {directory}")
    for col in ("id", "completed", "duration", "aligning", "written", "full", "keyed state",
                "status"):
        table.add_column(col, justify="left" if col in ("completed", "keyed state", "status")
                         else "right")
    for i in infos:
        ops = _operator_summary(i)
        state = ", ".join(f"{uid}: {o['state_entries']:,}" for uid, o in ops.items()
                          if o["state_bytes"]) or "-"
        when = datetime.datetime.fromtimestamp(i.completed_at).strftime("%H:%M:%S")
        # (Text, not markup: a problem names files, whose names may hold "[".)
        status = Text("ok") if i.verified else Text(f"CORRUPT: {i.problem}", style="red")
        if not i.metadata:  # nothing but the problem is known
            table.add_row(str(i.id), when, "-", "-", "-", "-", "-", status)
            continue
        table.add_row(f"{i.id}{'*' if i.final else ''}", when,
                      f"{i.duration * 1000:.0f} ms", f"{i.alignment_duration * 1000:.1f} ms",
                      _size(i.checkpointed_size), _size(i.full_size), state, status)
    table.caption = ("* final checkpoint (end of input); keyed state: entries per operator; "
                     "CORRUPT: its files do not match its metadata (recovery skips it)")
    console.print(table)


main.add_command(validate_command)


if __name__ == "__main__":
    main(prog_name="eddyflow")  # (python -m eddyflow.cli.main: not "main.py" in messages)
