"""``eddyflow validate DIR --job JOB.py``: Spark replay and validation of a
checkpoint (issue 5; the work is ``eddyflow.offline.validate``).

Exit codes: 0 when the checkpoint is consistent, 1 when it is not (a table
of the first mismatches, or the operators that could not be replayed), 2 on
a usage or input error (no such directory, checkpoint or job file; a job
file that does not load; a checkpoint that is damaged), each error one line
(cli/errors.py). The checkpoint's files are verified here, on the driver,
before Spark starts: a damaged checkpoint is named at once, not found by an
executor and reported through a hundred lines of Java (an executor's error
that gets through is unwrapped by ``validate`` all the same).
"""

from __future__ import annotations

import os
import sys
import time

import click
from rich.console import Console
from rich.table import Table

from eddyflow.checkpoint.layout import checkpoint_dir_name, parse_checkpoint_dir
from eddyflow.checkpoint.storage import CheckpointCorrupted, CheckpointStorage
from eddyflow.cli.errors import CliError, debug_enabled
from eddyflow.jobfile import JobFileError
from eddyflow.offline.checkpoint import CheckpointRef, open_checkpoint

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
    from eddyflow.offline import spark_session, validate
    from eddyflow.offline.replay import ReplayError

    # Messages are one line each whatever the terminal's width (or the
    # length of the checkpoint's path in them): rich would wrap them at 80
    # columns when the output is not a terminal. Tables still fit the width.
    console = Console(stderr=True, soft_wrap=True)
    if not os.path.isdir(directory):
        raise CliError(f"{directory!r} is not a directory")
    if not os.path.isfile(job):
        raise CliError(f"job file {job!r} does not exist")
    ref = _verified_checkpoint(directory, checkpoint_id)
    started = time.perf_counter()
    from pyspark.sql import SparkSession

    ours = SparkSession.getActiveSession() is None  # else embedded: leave it running
    spark = spark_session(master, app_name=f"eddyflow validate {checkpoint_dir_name(ref.id)}")
    if ours and not debug_enabled():
        # An executor's failure is reported by us, in one line; Spark would
        # log it first, with its Java stack, at level ERROR.
        spark.sparkContext.setLogLevel("FATAL")
    validated = False
    try:
        report = validate(spark, ref, job=job)
        validated = True
    except JobFileError as exc:
        raise CliError(str(exc)) from exc
    except CheckpointCorrupted as exc:  # found by an executor (changed since verified?)
        raise CliError(f"checkpoint {ref.id} of {directory} is damaged: {exc}") from exc
    except ReplayError as exc:
        console.print(f"[red]checkpoint {ref.id} cannot be validated:[/red] {exc}")
        sys.exit(1)
    finally:
        if ours and not validated:
            spark.stop()
    took = time.perf_counter() - started
    replayed = sum(report.records_replayed.values())
    console.print(f"checkpoint {report.checkpoint_id} ({report.checkpoint}): "
                  f"{replayed:,} source records replayed, {report.compared:,} state entries of "
                  f"{', '.join(report.operators) or 'no operator'} compared in {took:.1f} s")
    for what, (rows, where) in sorted(report.bootstrapped.items()):
        console.print(f"replayed from {rows:,} rows bootstrapped into {what} ({where})")
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


def _verified_checkpoint(directory: str, checkpoint_id: int | None) -> CheckpointRef:
    """The checkpoint to validate, every file of it checked against its
    metadata (size and SHA-256). Without ``--checkpoint``: the latest
    completed one, damaged or not (validating an older one instead would
    hide the damage)."""
    try:
        if checkpoint_id is None and parse_checkpoint_dir(directory) is None:
            ids = CheckpointStorage(directory).completed_ids()
            if not ids:
                raise CliError(f"{directory!r} holds no completed checkpoint")
            checkpoint_id = ids[-1]
        ref = open_checkpoint(directory, checkpoint_id)
        storage = CheckpointStorage(ref.root)
        for handle in ref.meta.files:
            storage.verify_file(handle)
    except (FileNotFoundError, CheckpointCorrupted) as exc:
        which = f"checkpoint {checkpoint_id} of {directory}" if checkpoint_id is not None \
            else directory
        raise CliError(f"{which} cannot be validated: {exc}") from exc
    return ref
