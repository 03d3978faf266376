"""MODEL on the command line: a local checkpoint directory or a Hugging Face Hub id (+ --revision).

`model_argument` gives a command the MODEL argument and `--revision`; the command's function
receives `model` as the local directory (tfcompile/io/hub.py resolves a Hub id into the
Hugging Face cache), so nothing after the command line knows the difference.
"""

from __future__ import annotations

import functools
from pathlib import Path

import click

REVISION_HELP = ("Branch, tag or commit of a Hub MODEL (default main); recorded in the manifest as the "
                 "commit sha. A Hub id ORG/NAME is resolved through the Hugging Face cache (HF_HOME, "
                 "HF_HUB_OFFLINE, HF_TOKEN).")


def resolve_params(kwargs: dict, names: tuple[str, ...], revision: str | None) -> None:
    """Replace each kwargs[name] (a path or a Hub id) by its local directory; the first one
    named takes --revision."""
    from tfcompile.io.hub import resolve_model

    for i, name in enumerate(names):
        if kwargs.get(name) is not None:
            option = "MODEL" if name == "model" else f"--{name}"
            kwargs[name] = resolve_model(kwargs[name], revision if i == 0 else None,
                                         quiet=bool(kwargs.get("quiet")), option=option).path


def model_argument(f):
    """The MODEL argument and --revision (quantize, distill)."""

    @functools.wraps(f)
    def command(*args, **kwargs):
        resolve_params(kwargs, ("model",), kwargs.pop("revision", None))
        return f(*args, **kwargs)

    command = click.option("--revision", metavar="REV", help=REVISION_HELP)(command)
    return click.argument("model", type=click.Path(path_type=Path))(command)
