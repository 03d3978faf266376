"""Build a Recipe from presets, a recipe file and CLI edits (one code path).

Presets < recipe file < CLI options < --set; then --skip / --until. The standard pipeline's
order is one list (`pipeline.passes.SCHEDULE`, set by passes/builtin.py); which of
its passes a format runs is declared by the passes themselves (their `when` and `implies`,
tfcompile/pipeline/passes.py): `preset_pipeline` only asks them.
"""

from __future__ import annotations

import dataclasses
import json
import tomllib
from pathlib import Path
from typing import Any, Iterable, Mapping

from tfcompile.errors import RecipeError
from tfcompile.io.bounded import MAX_DEPTH, json_depth, read_regular, unicode_text
from tfcompile.pipeline.passes import REGISTRY, SCHEDULE, Selection, Settings, get_pass
from tfcompile.recipe import RECIPE_VERSION, PassEntry, Recipe, build_config
from tfcompile.recipe.options import DEFAULT_FORMAT, RunOptions
from tfcompile.schemes import DISTILL_STARTS, format_name, get_scheme, preset_sets


def implied_settings(sel: Selection) -> dict[str, dict[str, Any]]:
    """Settings the format and the given settings imply (GPTQ: calibrate.hessian), by pass; the
    given ones are applied over them."""
    out: dict[str, dict[str, Any]] = {}
    for spec in REGISTRY.values():
        if spec.implies is not None:
            for name, values in spec.implies(sel).items():
                out.setdefault(name, {}).update(values)
    return out


def preset_pipeline(fmt: str, settings: Settings | None = None) -> list[str]:
    """The pass list `tfcompile quantize --format FMT` runs with these settings (pass -> {field:
    value} given; e.g. {"calibrate": {"kv_cache": "fp8"}} for --kv-cache fp8): every registered
    pass of the standard schedule (`pipeline.passes.SCHEDULE`) whose `when` holds, or that another
    pass's settings imply, in the schedule's order."""
    settings = dict(settings or {})
    scheme = get_scheme(fmt)
    implied = implied_settings(Selection(scheme, settings))
    sel = Selection(scheme, {**settings, **{n: {**v, **settings.get(n, {})} for n, v in implied.items()}})
    specs = [REGISTRY[n] for n in SCHEDULE]
    return [s.name for s in specs if s.name in implied or s.when is None or s.when(sel)]


def load_recipe_file(path: Path) -> dict:
    """Parse a TOML or JSON recipe file into a plain mapping (no code is run)."""
    raw = read_regular(path, "recipe")  # a regular file under 16 MiB: never /dev/zero or a FIFO
    if json_depth(raw) > MAX_DEPTH:
        raise RecipeError(f"recipe {path} is nested deeper than {MAX_DEPTH} levels", hint="see docs/cli.md")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise RecipeError(f"recipe {path} is not UTF-8 text", hint="recipes are TOML (.toml) or JSON (.json)") from None
    try:
        data = json.loads(text) if path.suffix == ".json" else tomllib.loads(text)
    except (ValueError, RecursionError) as e:  # JSONDecodeError, TOMLDecodeError, a 5000-digit integer
        raise RecipeError(f"recipe {path} is not valid {path.suffix.lstrip('.') or 'TOML'}: {e}",
                          hint="recipes are TOML (.toml) or JSON (.json)") from None
    if not isinstance(data, dict):
        raise RecipeError(f"recipe {path}: top level must be a table", hint="see docs/cli.md")
    if not unicode_text(data):
        raise RecipeError(f"recipe {path}: a string holds a lone surrogate (\\ud800...), no Unicode text",
                          hint="write the character itself, or its surrogate pair")
    version = data.get("version")
    if version != RECIPE_VERSION:
        raise RecipeError(f"recipe {path}: version {version!r} is not supported",
                          hint=f"set version = {RECIPE_VERSION}")
    unknown = set(data) - {"version", "format", "pipeline", "passes"}
    if unknown:
        raise RecipeError(f"recipe {path}: unknown key(s) {sorted(unknown)}",
                          hint="top-level keys: version, format, pipeline, passes")
    _check_types(data, path)
    return data


def _check_types(data: dict, path: Path) -> None:
    """format: a string; pipeline: a list of pass names; passes: a table of tables."""
    problems = {
        "format": "format" in data and not isinstance(data["format"], str),
        "pipeline": "pipeline" in data and not (isinstance(data["pipeline"], list)
                                                and all(isinstance(p, str) for p in data["pipeline"])),
        "passes": "passes" in data and not isinstance(data["passes"], dict),
    }
    for key, bad in problems.items():
        if bad:
            raise RecipeError(f"recipe {path}: {key} = {str(data[key])[:40]!r} is not "
                              + {"format": "a format name", "pipeline": "a list of pass names",
                                 "passes": "a table of [passes.NAME] tables"}[key],
                              hint='e.g. format = "nvfp4", pipeline = ["load", "select", ...], [passes.pack]')


def options_recipe(run: RunOptions, without: Iterable[str] = ()) -> Recipe:
    """The recipe of a run's options (the CLI's, or a library caller's): the format defaults to
    nvfp4 when neither a format nor a recipe file is given. `without`: as build_recipe's."""
    fmt = run.fmt if run.fmt is not None or run.recipe_file is not None else DEFAULT_FORMAT
    return build_recipe(fmt=fmt, recipe_file=run.recipe_file, preset=run.preset, sets=run.sets, skip=run.skip,
                        until=run.until, overrides=run.pass_settings(), device=run.device, without=without)


def build_recipe(
    *,
    fmt: str | None = None,
    recipe_file: Path | None = None,
    preset: str | None = None,
    sets: Iterable[str] = (),
    skip: Iterable[str] = (),
    until: str | None = None,
    overrides: Mapping[str, Mapping[str, Any]] | None = None,
    device: str | None = None,
    without: Iterable[str] = (),
) -> Recipe:
    """Presets < `preset` (--preset: schemes.PRESETS) < recipe file < CLI options (`overrides`,
    `device`) < --set; then --skip/--until. `device` (--device) sets the `device` of every
    scheduled pass that has one. `without`: passes whose settings, from any source, are dropped
    after the preset is chosen (the start of a distillation: tfcompile/cli/distill_start.py)."""
    data = load_recipe_file(recipe_file) if recipe_file else {"version": RECIPE_VERSION}
    fmt = fmt or data.get("format")
    fmt = format_name(fmt)  # --format NVFP4 = nvfp4 (names are lower case)
    edits = [(n, t, f"recipe passes.{n}") for n, t in (data.get("passes") or {}).items()]
    edits += [(n, t, f"option for pass {n}") for n, t in (overrides or {}).items()]
    for item in sets:
        name, key, raw = _parse_set(item)
        edits.append((name, {key: _parse_value(raw)}, f"--set {item}"))
    # under everything else; a run that distills takes the preset's distillation recipe
    given = _given(edits)
    edits = (_preset_edits(preset, fmt, "distill" in given) if preset else []) + edits
    # distill.init=gptq: settings of passes this run does not schedule (its calibration) are the start's
    # (tfcompile/cli/distill_start.py), as are the preset's
    for_start = str(_given(edits).get("distill", {}).get("init", "")) in DISTILL_STARTS
    without = set(without)
    edits = _route_exports([e for e in edits if e[0] not in without])
    # The preset's shape follows the settings, wherever they came from (the passes declare how)
    settings = _given(edits)
    pipeline = [n for n in data.get("pipeline") or (preset_pipeline(fmt, settings) if fmt else []) if n not in without]
    if not pipeline:
        raise RecipeError("no pipeline: give --format or a recipe with `format` or `pipeline`",
                          hint="e.g. tfcompile quantize --format nvfp4 MODEL -o OUT")
    values: dict[str, dict[str, Any]] = {n: {} for n in pipeline}
    if device is not None:  # after the recipe file, before --set (a CLI option)
        at = next((i for i, (_, _, w) in enumerate(edits) if w.startswith("--set")), len(edits))
        edits[at:at] = [(n, {"device": device}, "--device") for n in pipeline
                        if "device" in {f.name for f in dataclasses.fields(get_pass(n).config)}]
    for name in _format_passes(values) if fmt else ():  # the pass that chooses what is quantized
        values[name]["format"] = fmt
    for name, implied in implied_settings(Selection(get_scheme(fmt) if fmt else None, settings)).items():
        # under the user's own settings
        if name in values:
            values[name].update(implied)
    for name, table, where in edits:
        spec = REGISTRY.get(name)
        if name not in values and fmt and spec is not None and spec.unscheduled is not None:
            if isinstance(table, Mapping) and set(table) <= _runtime_fields(spec.config):
                continue  # a run-wide policy (e.g. calibrate.strict): moot where the pass does not run
            if where.startswith("--preset") or for_start:  # e.g. the preset's calibration, for an algorithm
                continue  # the user replaced; the start's calibration
            raise _unscheduled(spec, fmt, where, values)
        _merge(values, name, table, where)
    _check_format_agrees(fmt, values)
    pipeline = _cut(pipeline, skip, until)
    entries = tuple(PassEntry(n, build_config(get_pass(n).config, values[n], f"pass {n}"))
                    for n in pipeline)
    return Recipe(RECIPE_VERSION, fmt or "custom", entries)


def _preset_edits(preset: str, fmt: str | None, distill: bool) -> list[tuple[str, dict, str]]:
    """--preset NAME's settings for `fmt` as edits (pass, {field: value}, where); `distill`: the run
    distills (schemes.DISTILL_PRESETS)."""
    if not fmt:
        raise RecipeError(f"--preset {preset} chooses settings per format, and no format is given",
                          hint=f"add --format, e.g. --format nvfp4 --preset {preset}")
    edits = []
    for item in preset_sets(preset, fmt, distill):
        name, key, raw = _parse_set(item)
        edits.append((name, {key: _parse_value(raw)}, f"--preset {preset} ({item})"))
    return edits


def _format_passes(values: dict) -> list[str]:
    """The passes of the pipeline whose config has a `format` field: the one that chooses what is
    quantized (`Recipe.quant_format` reads it back; the core names no pass)."""
    return [n for n in values if any(f.name == "format" for f in dataclasses.fields(get_pass(n).config))]


def _check_format_agrees(fmt: str | None, values: dict) -> None:
    """The pass's `format` must be the format the pipeline was built for (its passes follow the format)."""
    for name in _format_passes(values):
        chosen = values[name].get("format")
        if fmt and chosen is not None and chosen != fmt:
            raise RecipeError(f"{name}.format={chosen!r} contradicts --format / recipe format {fmt!r}",
                              hint=f"give the format once: --format {chosen}")


def _runtime_fields(config: type) -> set[str]:
    """A pass's fields that state a run-wide policy rather than what the pass does (metadata `runtime`:
    e.g. calibrate.strict, which a release pipeline passes to every run, data-free formats included)."""
    return {f.name for f in dataclasses.fields(config) if f.metadata.get("runtime")}


def _unscheduled(spec, fmt: str, where: str, values: dict) -> RecipeError:
    """Settings of a pass the format's pipeline leaves out: the pass says why (`unscheduled`)."""
    why, hint = spec.unscheduled(get_scheme(fmt))
    return RecipeError(f"{where}: --format {fmt} {why} (pipeline: {', '.join(values)})", hint=hint)


def _given(edits: list) -> dict[str, dict[str, Any]]:
    """Every setting given, by pass (later edits win; a pass named with no values gets {})."""
    out: dict[str, dict[str, Any]] = {}
    for name, table, _ in edits:
        out.setdefault(name, {}).update(table if isinstance(table, Mapping) else {})
    return out


def _route_exports(edits: list) -> list:
    """A view in an `export` list (pack's views: --export onnx, or a recipe) that is the name of a
    registered pass (the `onnx` pass, passes/onnx.py) is that pass: drop it from the table and
    schedule the pass instead, so the exporting pass keeps only the views it writes itself."""
    out = []
    for name, table, where in edits:
        views = table.get("export") if isinstance(table, Mapping) else None
        routed = [v for v in views if v in REGISTRY] if isinstance(views, (list, tuple)) else []
        if routed:
            table = {**table, "export": [v for v in views if v not in REGISTRY]}
            out += [(v, {}, where) for v in routed]
        out.append((name, table, where))
    return out


def _merge(values: dict, name: str, table: Mapping[str, Any], where: str) -> None:
    if name not in values:
        raise RecipeError(f"{where}: pass {name!r} is not in this pipeline",
                          hint="pipeline: " + ", ".join(values))
    if not isinstance(table, Mapping):
        raise RecipeError(f"{where}: expected a table of options", hint="see docs/cli.md")
    cur = values[name]
    for k, v in table.items():
        if k == "ignore" and isinstance(v, (list, tuple)) and k in cur:
            cur[k] = tuple(cur[k]) + tuple(v)  # ignore lists extend, never replace
        else:
            cur[k] = v


def _parse_set(item: str) -> tuple[str, str, str]:
    key, sep, raw = item.partition("=")
    name, dot, field = key.partition(".")
    if not sep or not dot or not name or not field:
        raise RecipeError(f"--set {item!r} is not of the form pass.field=value",
                          hint="e.g. --set pack.max_shard_mb=2000")
    return name.strip(), field.strip(), raw.strip()


def _parse_value(raw: str) -> Any:
    """CLI values: JSON when it parses (numbers, true, lists), else the plain string."""
    if json_depth(raw) > MAX_DEPTH:
        raise RecipeError(f"--set value {raw[:40]!r}... is nested deeper than {MAX_DEPTH} levels",
                          hint="e.g. --set pack.max_shard_mb=2000")
    try:
        value = json.loads(raw)
    except ValueError:  # not JSON (or an integer over 4300 digits): the plain string
        return raw
    if not unicode_text(value):
        raise RecipeError(f"--set value {raw[:40]!r}: a string holds a lone surrogate, no Unicode text",
                          hint="write the character itself, or its surrogate pair")
    return value


def _cut(pipeline: list[str], skip: Iterable[str], until: str | None) -> list[str]:
    skip = list(skip)
    for s in skip + ([until] if until else []):
        if s not in pipeline:
            raise RecipeError(f"pass {s!r} is not in the pipeline",
                              hint="pipeline: " + ", ".join(pipeline))
    if until and until in skip:  # nothing would say the run stopped short of what was asked
        raise RecipeError(f"--until {until} names a pass --skip removes", hint=f"drop --skip {until}, or stop "
                          "at another pass")
    if until:
        pipeline = pipeline[: pipeline.index(until) + 1]
    return [p for p in pipeline if p not in skip]


__all__ = ["build_recipe", "preset_pipeline", "load_recipe_file"]
