"""Recipe: the one object that says what a run does.

A recipe file, `--format`, `--set pass.field=value`, `--skip` and `--until` all
edit this object; `tfcompile plan` prints it and the manifest stores it. A
recipe is an ordered tuple of (pass name, frozen config). Configs are built
from plain mappings with unknown keys rejected and values coerced to the
field's annotated type, so a typo fails before anything runs.
"""

from __future__ import annotations

import dataclasses
import math
import typing
from dataclasses import dataclass
from typing import Any, Mapping

from tfcompile.errors import RecipeError

RECIPE_VERSION = 1


@dataclass(frozen=True)
class PassEntry:
    name: str
    config: Any  # instance of the pass's frozen config dataclass


@dataclass(frozen=True)
class Recipe:
    version: int
    format: str  # the preset the pipeline was built from ("custom" if none)
    passes: tuple[PassEntry, ...]

    def names(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.passes)

    def config(self, name: str) -> Any:
        for p in self.passes:
            if p.name == name:
                return p.config
        raise KeyError(name)

    def quant_format(self) -> str:
        """The --format name the run quantizes to: that of the pass whose config has a `format`
        field (the one that chooses what is quantized: `select` in the standard pipeline; the core
        names no pass), else the recipe's own `format`."""
        for p in self.passes:
            if any(f.name == "format" for f in dataclasses.fields(p.config)):
                return p.config.format
        return self.format

    def to_dict(self) -> dict:
        """JSON-able and deterministic (field order is the dataclass order). Fields whose
        metadata says `runtime` (where work is kept, e.g. distill.resume_dir) are left out:
        they do not change the result, so the manifest does not record them."""
        return {
            "version": self.version,
            "format": self.format,
            "passes": [{"name": p.name, "config": _jsonable(_recorded(p.config))} for p in self.passes],
        }


def _recorded(config: Any) -> dict:
    """The config as recorded: runtime fields left out, and `omit_default` fields while at their
    default (a field added later then leaves the recipes, and artifact bytes, of runs without it as they were)."""
    fields = dataclasses.fields(config)
    skip = {f.name for f in fields if f.metadata.get("runtime")
            or (f.metadata.get("omit_default") and getattr(config, f.name) == f.default)}
    return {k: v for k, v in dataclasses.asdict(config).items() if k not in skip}


def _jsonable(v: Any) -> Any:
    if isinstance(v, dict):
        return {k: _jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    return v


def build_config(cls: type, values: Mapping[str, Any], where: str) -> Any:
    """Instantiate frozen dataclass `cls` from `values`; `where` names the source."""
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - set(fields))
    if unknown:
        raise RecipeError(
            f"{where}: unknown option(s) {', '.join(unknown)}",
            hint="valid options: " + (", ".join(fields) or "(none)"),
        )
    hints = typing.get_type_hints(cls)
    kwargs = {k: coerce(v, hints[k], f"{where}.{k}") for k, v in values.items()}
    try:
        return cls(**kwargs)
    except (TypeError, ValueError) as e:
        raise RecipeError(f"{where}: {e}", hint="check the option values") from None


def coerce(value: Any, tp: Any, where: str) -> Any:
    """Coerce a TOML/JSON/CLI value to annotation `tp` (str, int, float, bool, tuples, Optional)."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, getattr(__import__("types"), "UnionType", None)):
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        return coerce(value, inner[0], where)
    if origin is tuple:
        if isinstance(value, str):
            value = [s for s in value.split(",") if s]
        if not isinstance(value, (list, tuple)):
            raise RecipeError(f"{where}: expected a list, got {value!r}", hint="use [a, b] or a,b")
        elem = args[0] if args else str
        return tuple(coerce(v, elem, where) for v in value)
    if tp is bool:
        if isinstance(value, str) and value.lower() in ("true", "1", "yes", "false", "0", "no"):
            return value.lower() in ("true", "1", "yes")
        if isinstance(value, bool):
            return value
        raise RecipeError(f"{where}: expected true/false, got {value!r}", hint="use true or false")
    if tp in (int, float):
        try:
            if isinstance(value, bool) or (tp is int and isinstance(value, float) and not value.is_integer()):
                raise ValueError  # 2.9 for an int is an error, never truncated to 2
            number = tp(value)
        except (TypeError, ValueError, OverflowError):
            raise RecipeError(f"{where}: expected {tp.__name__}, got {str(value)[:40]!r}",
                              hint=f"give {'a whole' if tp is int else 'a'} number for {where}") from None
        if isinstance(number, float) and not math.isfinite(number):  # inf / NaN: no option means anything by them
            raise RecipeError(f"{where}: expected a finite {tp.__name__}, got {number!r}",
                              hint=f"give a finite number for {where}")
        return number
    if tp is str:
        if not isinstance(value, str):
            raise RecipeError(f"{where}: expected a string, got {value!r}", hint="quote the value")
        return value
    return value
