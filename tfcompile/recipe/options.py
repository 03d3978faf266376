"""The options of a run, as one object, and the recipe they build.

`tfcompile quantize`, `distill` and `plan` (and the library) describe a run with a
`RunOptions`: the format or recipe file, `--preset`, `--set`, `--skip`/`--until`, `--device`,
and `settings`, the pass tables the other options set (`--calib-samples N` is
{"calibrate": {"samples": N}}: each CLI flag names its pass field, tfcompile/cli/flags.py).
`recipe/build.py` `options_recipe()` merges them over the presets; no option
names a pass to schedule: the passes decide that from the settings given
(tfcompile/pipeline/passes.py `when` / `implies`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from tfcompile.schemes import get_scheme, preset_sets

DEFAULT_FORMAT = "nvfp4"  # when neither --format nor --recipe is given


@dataclass(frozen=True)
class RunOptions:
    fmt: str | None = None  # --format
    recipe_file: Path | None = None  # --recipe
    preset: str | None = None  # --preset NAME: schemes.PRESETS' settings for the format, under everything else
    sets: tuple[str, ...] = ()  # --set pass.field=value
    # the pass tables the options set, {pass: {field: value}}: only what was given (a pass with an
    # empty table is scheduled with its defaults, e.g. --report); the CLI's flags name their field
    # (tfcompile/cli/flags.py `setting`)
    settings: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    device: str | None = None  # --device: every scheduled pass's `device` (tfcompile/dist/devices.py)
    skip: tuple[str, ...] = ()
    until: str | None = None

    def pass_settings(self) -> dict[str, dict[str, Any]]:
        """The pass tables these options set (copies)."""
        return {name: dict(table) for name, table in self.settings.items()}

    def check_names(self) -> None:
        """RecipeError for an unknown --format, before the passes (and torch) are imported: a
        mistyped name fails in a tenth of a second, with the error the recipe's build would give."""
        if self.fmt is not None:
            get_scheme(self.fmt)
        if self.preset is not None:
            preset_sets(self.preset, self.fmt or DEFAULT_FORMAT)
