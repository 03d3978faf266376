"""MODEL on the command line: a local checkpoint directory or a Hugging Face Hub id (+ --revision).

quantize and distill take MODEL and `--revision` through `artifact_options`
(tfcompile/cli/flags.py), `eval` its MODEL and `--reference` through `resolve_params`; either
way the command receives local directories (tfcompile/io/hub.py resolves a Hub id into the
Hugging Face cache), so nothing after the command line knows the difference.
"""

from __future__ import annotations

from tfcompile.io.hub import resolve_model

REVISION_HELP = ("Branch, tag or commit of a Hub MODEL (default main); recorded in the manifest as the "
                 "commit sha. A Hub id ORG/NAME is resolved through the Hugging Face cache (HF_HOME, "
                 "HF_HUB_OFFLINE, HF_TOKEN).")


def resolve_params(kwargs: dict, names: tuple[str, ...], revision: str | None) -> None:
    """Replace each kwargs[name] (a path or a Hub id) by its local directory; the first one
    named takes --revision."""
    for i, name in enumerate(names):
        if kwargs.get(name) is not None:
            option = "MODEL" if name == "model" else f"--{name}"
            kwargs[name] = resolve_model(kwargs[name], revision if i == 0 else None,
                                         quiet=bool(kwargs.get("quiet")), option=option).path
