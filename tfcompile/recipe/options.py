"""The options of a run, as one object, and the recipe they build.

`tfcompile quantize`, `distill` and `plan` (and the library) describe a run with a
`RunOptions`: the format or recipe file, `--set`, `--skip`/`--until`, and the options
that set a pass's fields (`--calib`, `--algorithm`, `--eval`, `--target`, `--layout`,
...). `to_recipe()` turns them into the pass tables `build_recipe` merges over the
presets; no option names a pass to schedule: the passes decide that from the settings
given (tfcompile/pipeline/passes.py `when` / `implies`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

from tfcompile.schemes import get_scheme, preset_sets

if TYPE_CHECKING:
    from tfcompile.pipeline.recipe import Recipe

DEFAULT_FORMAT = "nvfp4"  # when neither --format nor --recipe is given


@dataclass(frozen=True)
class CalibOptions:
    """calibrate.* (`--calib`, `--calib-samples` ..., `--observer`, `--kv-cache`, `--kv-per-head`)."""
    data: str | None = None
    samples: int | None = None
    seq_len: int | None = None
    seed: int | None = None
    observer: str | None = None
    kv_cache: str | None = None
    kv_per_head: bool | None = None
    all_experts: bool | None = None  # --calib-all-experts (MoE)
    strict: bool | None = None  # --calib-strict: `auto` fails instead of falling back


@dataclass(frozen=True)
class EvalOptions:
    """eval.* (`--eval`, `--eval-text`, `--eval-max-tokens`, the gates)."""
    enabled: bool | None = None
    text: str | None = None
    max_tokens: int | None = None
    max_kl: float | None = None
    max_ppl_increase: float | None = None
    min_top1: float | None = None
    tasks: tuple[str, ...] | None = None  # --task: lm-eval task gates (tfcompile/tasks)
    max_task_drop: float | None = None
    task_limit: int | None = None  # --limit
    keep_rejected: bool | None = None  # --no-keep-rejected: False


@dataclass(frozen=True)
class LayoutOptions:
    """layout.* (`--layout`, `--tp`, `--kv-layout`, `--kv-block-size`)."""
    target: str | None = None
    tp: int | None = None
    kv_layout: str | None = None
    block_size: int | None = None


@dataclass(frozen=True)
class RunOptions:
    fmt: str | None = None  # --format
    recipe_file: Path | None = None  # --recipe
    preset: str | None = None  # --preset NAME: schemes.PRESETS' settings for the format, under everything else
    sets: tuple[str, ...] = ()  # --set pass.field=value
    ignore: tuple[str, ...] = ()  # --ignore
    exports: tuple[str, ...] = ()  # --export modelopt|onnx
    algorithm: str | None = None  # --algorithm
    calib: CalibOptions = field(default_factory=CalibOptions)
    evaluation: EvalOptions = field(default_factory=EvalOptions)
    targets: str | None = None  # --target sm_90a,sm_100a
    cutlass: str | None = None  # --cutlass auto|always|never
    layout: LayoutOptions = field(default_factory=LayoutOptions)
    distill: Mapping[str, Any] | None = None  # tfcompile distill: distill.* fields given
    report: bool | None = None  # --report: OUT/tfcompile/report.html (passes/report.py)
    allow_unknown_architecture: bool | None = None  # load.allow_unknown_architecture
    engines: tuple[str, ...] = ()  # --engine: verify.engines, refusing what they cannot load
    device: str | None = None  # --device: every scheduled pass's `device` (tfcompile/dist/devices.py)
    skip: tuple[str, ...] = ()
    until: str | None = None

    def pass_settings(self) -> dict[str, dict[str, Any]]:
        """The pass tables these options set (only what was given)."""
        out: dict[str, dict[str, Any]] = {}
        if self.allow_unknown_architecture:
            out["load"] = {"allow_unknown_architecture": True}
        if self.engines:
            out["verify"] = {"engines": list(self.engines), "engine_strict": True}
        if self.report:
            out["report"] = {}
        if self.cutlass:
            out["emit_cutlass"] = {"compile": self.cutlass}
        if self.distill is not None:
            out["distill"] = dict(self.distill)
        if layout := _given(self.layout):
            out["layout"] = layout
        if self.targets:
            out["emit"] = {"targets": self.targets}
        ev = {k: v for k, v in _given(self.evaluation).items() if k != "enabled"}
        if self.evaluation.enabled or set(ev) - {"keep_rejected"}:  # --eval, or any eval option, runs it
            out["eval"] = ev
        if self.algorithm:
            out["quantize"] = {"algorithm": self.algorithm}
        if calib := _given(self.calib):
            out["calibrate"] = calib
        if self.ignore:
            out["select"] = {"ignore": list(self.ignore)}
        if self.exports:
            out["pack"] = {"export": list(self.exports)}
        return out

    def check_names(self) -> None:
        """RecipeError for an unknown --format, before the passes (and torch) are imported: a
        mistyped name fails in a tenth of a second, with the error to_recipe() would give."""
        if self.fmt is not None:
            get_scheme(self.fmt)
        if self.preset is not None:
            preset_sets(self.preset, self.fmt or DEFAULT_FORMAT)

    def to_recipe(self) -> Recipe:
        # lazy: the pass registry (pipeline.passes) imports torch; the CLI builds these options at start-up
        from tfcompile.recipe.build import build_recipe

        fmt = self.fmt if self.fmt is not None or self.recipe_file is not None else DEFAULT_FORMAT
        return build_recipe(fmt=fmt, recipe_file=self.recipe_file, preset=self.preset, sets=self.sets, skip=self.skip,
                            until=self.until, overrides=self.pass_settings(), device=self.device)


def _given(opts: object) -> dict[str, Any]:
    """The fields of an options dataclass that were given (not None)."""
    return {k: v for k, v in vars(opts).items() if v is not None}
