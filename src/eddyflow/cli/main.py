"""``eddyflow run JOB.py``: run a job file's ``build(env)`` to completion and
report what each operator did."""

from __future__ import annotations

import os
import sys

import click

from eddyflow.errors import JobFailed
from eddyflow.jobfile import JobFileError, build_environment
from eddyflow.result import JobResult

__all__ = ["main"]


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
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
@click.option("--name", default=None, help="Job name (default: the file's name).")
def run(job: str, restore: str | None, parallelism: int | None, name: str | None) -> None:
    """Run JOB.py, a file that defines build(env)."""
    options = {} if parallelism is None else {"parallelism": parallelism}
    try:
        env, _ = build_environment(job, **options)
    except JobFileError as exc:
        raise click.UsageError(str(exc)) from exc
    except (TypeError, ValueError, OSError) as exc:
        click.echo(f"error: invalid job {job}: {exc}", err=True)
        sys.exit(2)
    job_name = name or os.path.splitext(os.path.basename(job))[0]
    try:
        result = env.execute(job_name, restore=restore)
    except JobFailed as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(1)
    click.echo(format_result(result), err=True)


if __name__ == "__main__":
    main()
