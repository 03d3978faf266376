"""`tfcompile` command line. Exit codes: 0 ok, 1 user error or failed check, 2 usage/internal.

The group and the error handling; each command is its own module (tfcompile/cli/<command>.py)
and takes its options through the shared groups of tfcompile/cli/options.py.
"""

from __future__ import annotations

import sys
import traceback

import click

from tfcompile import __version__
from tfcompile.cli.distill import distill
from tfcompile.cli.eval import eval_cmd
from tfcompile.cli.export_onnx import export_onnx
from tfcompile.cli.inspect import inspect
from tfcompile.cli.plan import plan
from tfcompile.cli.quantize import quantize
from tfcompile.cli.tune import tune
from tfcompile.cli.verify import verify
from tfcompile.errors import TfcompileError

CONTEXT = {"help_option_names": ["-h", "--help"], "auto_envvar_prefix": "TFCOMPILE"}


@click.group(context_settings=CONTEXT)
@click.version_option(__version__, prog_name="tfcompile")
def cli() -> None:
    """Compress and compile LLM checkpoints into packed low-precision artifacts."""


for _command in (quantize, distill, plan, inspect, verify, tune, export_onnx, eval_cmd):
    cli.add_command(_command)


def main(argv: list[str] | None = None) -> int:
    """Entry point: maps errors to exit codes and `error:` / `hint:` lines."""
    try:
        cli.main(args=argv, prog_name="tfcompile", standalone_mode=False)
        return 0
    except click.exceptions.Exit as e:
        return e.exit_code
    except click.ClickException as e:
        e.show(file=sys.stderr)
        return 2
    except click.exceptions.Abort:
        sys.stderr.write("aborted\n")
        return 130
    except TfcompileError as e:
        _print_error(e.message, e.hint)
        return e.exit_code
    except SystemExit as e:
        return int(e.code or 0)
    except KeyboardInterrupt:
        sys.stderr.write("interrupted; no output was written\n")
        return 130
    except Exception as e:  # noqa: BLE001 - internal error: exit 2 with the trace
        traceback.print_exc(file=sys.stderr)
        _print_error(f"internal error: {type(e).__name__}: {e}",
                     "this is a tfcompile bug; please report it with the command you ran")
        return 2


def _print_error(message: str, hint: str | None) -> None:
    sys.stderr.write(f"error: {message}\n")
    sys.stderr.write(f"hint: {hint or 'run with --help for usage'}\n")


def entry() -> None:
    """Console-script wrapper (`tfcompile`)."""
    sys.exit(main())


if __name__ == "__main__":
    entry()
