"""How the ``eddyflow`` commands report errors (issue 13).

One line per error on stderr, ``error: <what, where, why>``, and an exit
code: :data:`USAGE` (2) for usage and input errors (a bad option, a job
file that is missing, does not compile or import, or whose ``build(env)``
raises; a checkpoint that does not exist or does not verify; a restore that
does not fit the job) and :data:`FAILED` (1) for a job that fails while it
runs. ``--debug`` (before or after the command's name) prints the full
traceback of the error's cause first.

:class:`EddyflowGroup` is the ``eddyflow`` command group: it gives every
command the ``--debug`` option and turns whatever a command raises into a
:class:`CliError`: click's own usage errors (otherwise several lines of
usage text), :class:`~eddyflow.errors.JobFailed`, and anything unexpected.
Commands raise :class:`CliError` themselves where they know better.
"""

from __future__ import annotations

import traceback
from typing import IO, Any

import click

from eddyflow.errors import JobFailed, one_line

__all__ = ["FAILED", "USAGE", "CliError", "EddyflowGroup", "debug_enabled", "job_failed_line"]

#: Exit code of a usage or input error (click's own, for its usage errors).
USAGE = 2
#: Exit code of a job that failed while it ran.
FAILED = 1

_DEBUG = "eddyflow.debug"  # key of the flag in the click context's shared meta


class CliError(click.ClickException):
    """An error for the person at the terminal: one line, an exit code, and
    (``--debug``) the traceback of the exception it was raised from."""

    def __init__(self, message: str, exit_code: int = USAGE) -> None:
        super().__init__(one_line(message))
        # (Click declares exit_code a class variable; it reads it from the
        # instance it catches.)
        self.exit_code = exit_code  # type: ignore[misc]
        self.debug = False

    def show(self, file: IO[Any] | None = None) -> None:
        cause = self.__cause__
        if self.debug and cause is not None:
            click.echo("".join(traceback.format_exception(cause)).rstrip("\n"), err=True)
        click.echo(f"error: {self.format_message()}", file=file, err=file is None)


def job_failed_line(exc: JobFailed) -> str:
    """A failed job's message, with its notes (how often it was restarted)."""
    notes = [one_line(n) for n in getattr(exc, "__notes__", ())]
    return f"{exc} ({'; '.join(notes)})" if notes else str(exc)


def debug_enabled(ctx: click.Context | None = None) -> bool:
    """Whether ``--debug`` was given (to this command or to ``eddyflow``)."""
    ctx = ctx or click.get_current_context(silent=True)
    return bool(ctx is not None and ctx.meta.get(_DEBUG))


def _set_debug(ctx: click.Context, _param: click.Parameter, value: bool) -> None:
    if value:
        ctx.meta[_DEBUG] = True  # meta is shared by a context and its children


def debug_option() -> click.Option:
    return click.Option(["--debug"], is_flag=True, expose_value=False, is_eager=True,
                        callback=_set_debug, help="Show the full traceback of an error.")


def _usage_error(exc: click.UsageError) -> CliError:
    """Click's usage error as one line, pointing at the command's help."""
    ctx = exc.ctx
    hint = f" (see '{ctx.command_path} --help')" if ctx is not None else ""
    error = CliError(exc.format_message().rstrip(".") + hint, USAGE)
    error.__cause__ = exc
    error.debug = debug_enabled(ctx)
    return error


class EddyflowGroup(click.Group):
    """The ``eddyflow`` group: ``--debug`` on every command, every error as
    a :class:`CliError` (see the module docstring)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.params.append(debug_option())  # `eddyflow --debug COMMAND ...`

    def add_command(self, cmd: click.Command, name: str | None = None) -> None:
        # Given here rather than in each command's decorators: commands keep
        # their own option lists (and the flag is accepted after the
        # command's name too: `eddyflow run JOB --debug`).
        if not any(p.name == "debug" for p in cmd.params):
            cmd.params.append(debug_option())
        super().add_command(cmd, name)

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        try:
            return super().parse_args(ctx, args)
        except click.exceptions.NoArgsIsHelpError:
            raise  # `eddyflow` alone: the help text, as click shows it
        except click.UsageError as exc:  # `eddyflow --bogus`
            raise _usage_error(exc) from exc

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except (click.exceptions.Exit, click.exceptions.Abort,
                click.exceptions.NoArgsIsHelpError):
            raise  # --help, --version, ^C: click's own way
        except CliError as exc:
            exc.debug = debug_enabled(ctx)
            raise
        except click.UsageError as exc:
            raise _usage_error(exc) from exc
        except click.ClickException as exc:
            error = CliError(exc.format_message(), exc.exit_code)
            error.debug = debug_enabled(ctx)
            raise error from exc
        except JobFailed as exc:
            error = CliError(job_failed_line(exc), FAILED)
            error.debug = debug_enabled(ctx)
            raise error from exc
        except Exception as exc:  # a bug, most likely: still one line (--debug: where)
            error = CliError(f"{type(exc).__name__}: {exc}", FAILED)
            error.debug = debug_enabled(ctx)
            raise error from exc
