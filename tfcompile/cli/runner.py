"""What the commands that write an artifact share: the recipe, the reporter, the run, the JSON."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from tfcompile.cli.main import importing
from tfcompile.cli.flags import ArtifactOptions
from tfcompile.cli.output import RichReporter, live_progress_allowed, rank_output
from tfcompile.cli.tables import summary_table
from tfcompile.recipe.options import RunOptions

if TYPE_CHECKING:  # annotations only: pipeline.context imports torch, which --help must not
    from tfcompile.pipeline.context import Context
    from tfcompile.recipe import Recipe


class ArtifactRun:
    """One `quantize` / `distill` run: its recipe and a reporter on stderr."""

    def __init__(self, art: ArtifactOptions, run: RunOptions, *, notes: bool = False):
        run.check_names()
        # every pass and the libraries they import (onnx among them, ~3 s here): only the commands
        # that run passes pay it, and importing it registers the passes the recipe names
        with importing():
            from tfcompile import api  # lazy: torch, transformers and every pass
            from tfcompile.recipe.build import options_recipe  # lazy: the pass registry imports torch

        self.recipe: Recipe = options_recipe(run)
        self.console, quiet, as_json = rank_output(art.quiet, art.as_json)  # torchrun: rank 0 prints
        self.api, self.art = api, dataclasses.replace(art, quiet=quiet, as_json=as_json)
        self.reporter = RichReporter(self.console, quiet=quiet)
        if notes and not quiet and not live_progress_allowed(self.console):
            self.reporter.note = self.console.print  # plain progress lines (loss, ETA) off a TTY

    def run(self) -> Context:
        art = self.art
        return self.api.run_pipeline(art.model, art.out, self.recipe, overwrite=art.overwrite,
                                     reporter=self.reporter, sign_key=art.sign_key)

    def print_summary(self, ctx: Context, *extra) -> None:
        """The summary table, `extra` renderables (tables, lines), where the artifact went."""
        if ctx.manifest is not None and not self.art.quiet:
            self.console.print(summary_table(ctx.manifest))
            for x in extra:
                self.console.print(x)
            self.console.print(f"wrote [bold]{self.art.out}[/]")

    def result(self, ctx: Context, **extra) -> dict:
        """The --json document."""
        m = ctx.manifest
        return {"ok": True, "output": str(self.art.out) if ctx.artifact else None,
                "recipe": self.recipe.to_dict(), "passes": ctx.pass_stats,
                "summary": m["summary"] if m else None, **extra, "warnings": self.reporter.warnings}
