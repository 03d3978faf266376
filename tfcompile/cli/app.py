"""`tfcompile` command line. Exit codes: 0 ok, 1 user error or failed check, 2 usage/internal.

The group and the error handling; each command is its own module (tfcompile/cli/<command>.py),
imported only when that command is named (tfcompile/cli/lazy.py: `--help` lists them from a table),
and takes its options through the shared groups of tfcompile/cli/flags.py. Imported only by
tfcompile/cli/main.py, whose entry point covers start-up's signals; torch, transformers and the
commands' modules load later, when a command runs.
"""

from __future__ import annotations

import sys
import traceback

import click

from tfcompile import __version__
from tfcompile.cli.lazy import LazyGroup
from tfcompile.errors import TfcompileError
from tfcompile.io.signals import Terminated, handle_signals

CONTEXT = {"help_option_names": ["-h", "--help"], "auto_envvar_prefix": "TFCOMPILE"}


@click.group(cls=LazyGroup, context_settings=CONTEXT)
@click.version_option(__version__, prog_name="tfcompile")
def cli() -> None:
    """Compress and compile LLM checkpoints into packed low-precision artifacts."""


def main(argv: list[str] | None = None, *, final: bool = False) -> int:
    """Run one command: maps errors to exit codes and `error:` / `hint:` lines. `final`: the
    process exits after it (tfcompile/cli/main.py `entry`), so signals stay ignored afterwards."""
    try:
        # SIGINT / SIGTERM / SIGHUP: clean unwinding, exit 130 / 143 / 129 (tfcompile/io/signals.py)
        with handle_signals(final=final):
            return _main(argv)
    except Terminated as e:  # came in the few bytecodes between the command's end and the handler's
        return _interrupted(e)


def _main(argv: list[str] | None) -> int:
    try:
        cli.main(args=argv, prog_name="tfcompile", standalone_mode=False)
        return 0
    except click.exceptions.Exit as e:
        return e.exit_code
    except click.ClickException as e:
        e.show(file=sys.stderr)
        sys.stderr.write(f"hint: {_usage_hint(e)}\n")
        return 2
    except click.exceptions.Abort as e:  # click turns KeyboardInterrupt (and Terminated) into Abort
        if isinstance(e.__cause__, KeyboardInterrupt):
            return _interrupted(e.__cause__)
        sys.stderr.write("aborted\n")
        return 130
    except TfcompileError as e:
        _print_error(e.message, e.hint)
        return e.exit_code
    except SystemExit as e:
        return int(e.code or 0)
    except KeyboardInterrupt as e:
        return _interrupted(e)
    except Exception as e:  # noqa: BLE001 - internal error: exit 2 with the trace
        traceback.print_exc(file=sys.stderr)
        _print_error(f"internal error: {type(e).__name__}: {e}",
                     "this is a tfcompile bug; please report it with the command you ran")
        return 2


def _interrupted(e: KeyboardInterrupt) -> int:
    """Exit 128 + signal (130 for Ctrl-C, 143 for SIGTERM) with one line, never a traceback."""
    name = e.name if isinstance(e, Terminated) else "SIGINT"
    published = getattr(e, "published", None)
    what = f"{published} was written before it arrived" if published else "nothing was written"
    sys.stderr.write(f"interrupted by {name}; {what}, temporary files were removed\n")
    return e.exit_code if isinstance(e, Terminated) else 130


def _usage_hint(e: click.ClickException) -> str:
    """The `hint:` line after click's own usage error (which may already say "Did you mean")."""
    ctx = getattr(e, "ctx", None)
    path = ctx.command_path if ctx is not None else "tfcompile"
    return f"run `{path} --help` for the options and arguments"


def _print_error(message: str, hint: str | None) -> None:
    sys.stderr.write(f"error: {message}\n")
    sys.stderr.write(f"hint: {hint or 'run with --help for usage'}\n")
