"""The `tfcompile` group's commands, imported only when one is asked for.

`tfcompile --help` lists every command with its short help from `COMMANDS` below, without
importing a command's module; `tfcompile CMD ...` (its --help and usage errors included) imports
that one module, which imports torch, transformers, onnx or triton only when the command runs
(inside its function, `# lazy:`). tests/cli/test_startup.py checks that each entry's short help
is the command's own (`get_short_help_str`, untruncated) and that start-up imports no heavy package.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass

import click


@dataclass(frozen=True)
class LazyCommand:
    module: str  # tfcompile.cli.<module>
    attr: str  # the click.Command object in it
    short_help: str  # the first sentence of its docstring, as click would show it untruncated


# name -> where the command lives, and its short help for `tfcompile --help` (sorted by name, as click lists)
COMMANDS = {
    "distill": LazyCommand("tfcompile.cli.distill", "distill",
                           "Quantize MODEL with quantization-aware distillation against the original; write OUT."),
    "draft": LazyCommand("tfcompile.cli.draft_cmd", "draft_cmd",
                         "Train an EAGLE-3 draft for MODEL (or for --target-artifact as served) and write OUT."),
    "eval": LazyCommand("tfcompile.cli.eval", "eval_cmd",
                        "Evaluate MODEL (artifact or checkpoint) against --reference: perplexity, KL, top-1, "
                        "layer SQNR."),
    "export-onnx": LazyCommand("tfcompile.cli.export_onnx", "export_onnx",
                               "Export ARTIFACT (or a plain checkpoint) as ONNX with quantize/dequantize nodes."),
    "inspect": LazyCommand("tfcompile.cli.inspect", "inspect", "Show an artifact's manifest: format, sizes, per-layer SQNR."),
    "plan": LazyCommand("tfcompile.cli.plan", "plan",
                        "Print the resolved recipe (JSON on stdout) without running it; --estimate: what it needs."),
    "quantize": LazyCommand("tfcompile.cli.quantize", "quantize",
                            "Quantize the Hugging Face checkpoint MODEL into an artifact at OUT."),
    "report": LazyCommand("tfcompile.cli.report_cmd", "report_cmd",
                          "Write ARTIFACT's report: summary, per-layer SQNR (and KL) plots, eval gates, formats and "
                          "sizes, kernels and targets, provenance."),
    "sign": LazyCommand("tfcompile.cli.sign_cmd", "sign_cmd", "Sign ARTIFACT's manifest (writes ARTIFACT/tfcompile/manifest.sig)."),
    "tune": LazyCommand("tfcompile.cli.tune", "tune", "Tune the artifact's kernels; write ARTIFACT/kernels/tuning.json."),
    "verify": LazyCommand("tfcompile.cli.verify", "verify",
                          "Check paths, files, checksums, signature, layers, shapes, scales and shared global scales "
                          "(exit 1 on failure)."),
}


class LazyGroup(click.Group):
    """A click.Group whose commands are `COMMANDS` entries, imported on first use."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*COMMANDS, *self.commands})

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name not in self.commands and name in COMMANDS:
            entry = COMMANDS[name]
            self.add_command(getattr(importlib.import_module(entry.module), entry.attr), name)
        return self.commands.get(name)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """click's own listing (same widths and truncation), with the short help from the table."""
        names = self.list_commands(ctx)
        if not names:
            return
        limit = formatter.width - 6 - max(len(n) for n in names)
        # a stand-in command truncates the table's text as click truncates the command's own
        rows = [(n, click.Command(n, help=self._short_help(ctx, n)).get_short_help_str(limit)) for n in names]
        with formatter.section("Commands"):
            formatter.write_dl(rows)

    def _short_help(self, ctx: click.Context, name: str) -> str:
        if name in self.commands or name not in COMMANDS:  # already imported (or added eagerly)
            return self.commands[name].get_short_help_str(limit=10**6)
        return COMMANDS[name].short_help
