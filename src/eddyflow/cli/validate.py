"""``eddyflow validate DIR --job JOB.py``: Spark replay and validation of a
checkpoint (issue 5; the work is ``eddyflow.offline.validate``).

Exit codes: 0 when the checkpoint is consistent, 1 when it is not (a table
of the first mismatches, or the operators that could not be replayed), 2 on
a usage error (no such directory, checkpoint or job file).
"""

from __future__ import annotations

import os
import sys
import time

import click
from rich.console import Console
from rich.table import Table

from eddyflow.jobfile import JobFileError
from eddyflow.state.storage import CheckpointCorrupted, checkpoint_dir_name

__all__ = ["validate_command"]


@click.command("validate")
@click.argument("directory", type=click.Path(file_okay=False))
@click.option("--job", required=True, type=click.Path(dir_okay=False),
              help="The job file (defines build(env)) that wrote the checkpoints.")
@click.option("--checkpoint", "checkpoint_id", type=int, default=None, metavar="N",
              help="Checkpoint N of DIRECTORY (default: the latest).")
@click.option("--master", default="local[*]", show_default=True,
              help="Spark master URL (local[*], spark://host:7077, yarn, …).")
@click.option("--show", "show_rows", type=click.IntRange(min=1), default=20, show_default=True,
              help="Mismatches to print.")
def validate_command(directory: str, job: str, checkpoint_id: int | None, master: str,
                     show_rows: int) -> None:
    """Replay JOB's input up to a checkpoint in DIRECTORY on Spark and check
    that the checkpoint's keyed state is exactly what that input gives."""
    from eddyflow.offline import open_checkpoint, spark_session, validate
    from eddyflow.offline.replay import ReplayError

    # Messages are one line each whatever the terminal's width (or the
    # length of the checkpoint's path in them): rich would wrap them at 80
    # columns when the output is not a terminal. Tables still fit the width.
    console = Console(stderr=True, soft_wrap=True)
    if not os.path.isdir(directory):
        raise click.UsageError(f"{directory!r} is not a directory")
    if not os.path.isfile(job):
        raise click.UsageError(f"job file {job!r} does not exist")
    try:
        ref = open_checkpoint(directory, checkpoint_id)
    except (FileNotFoundError, CheckpointCorrupted) as exc:
        raise click.UsageError(str(exc)) from exc
    started = time.perf_counter()
    from pyspark.sql import SparkSession

    ours = SparkSession.getActiveSession() is None  # else embedded: leave it running
    spark = spark_session(master, app_name=f"eddyflow validate {checkpoint_dir_name(ref.id)}")
    try:
        report = validate(spark, ref, job=job)
    except JobFileError as exc:
        raise click.UsageError(str(exc)) from exc
    except (ReplayError, CheckpointCorrupted) as exc:
        console.print(f"[red]checkpoint {ref.id} cannot be validated:[/red] {exc}")
        sys.exit(1)
    took = time.perf_counter() - started
    replayed = sum(report.records_replayed.values())
    console.print(f"checkpoint {report.checkpoint_id} ({report.checkpoint}): "
                  f"{replayed:,} source records replayed, {report.compared:,} state entries of "
                  f"{', '.join(report.operators) or 'no operator'} compared in {took:.1f} s")
    for uid, why in sorted(report.unreplayed.items()):
        console.print(f"[yellow]not replayed:[/yellow] {uid}: {why}")
    if report.mismatch_count:
        table = Table(title=f"{report.mismatch_count:,} mismatching state entries "
                            f"(first {min(show_rows, report.mismatch_count)})")
        for col in ("operator", "state", "key", "expected", "actual"):
            table.add_column(col)
        for row in report.first_mismatches(show_rows):
            table.add_row(*("∅" if v is None else str(v) for v in row))
        console.print(table)
    if report.ok:
        console.print(f"[green]consistent[/green]: checkpoint {report.checkpoint_id}")
    else:
        console.print(f"[red]NOT consistent[/red]: checkpoint {report.checkpoint_id}")
    if ours:
        spark.stop()
    sys.exit(0 if report.ok else 1)
