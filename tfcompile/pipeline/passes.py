"""The pass API and registry.

A pass is a name, a frozen config dataclass (unknown keys are rejected when a
recipe is parsed), the context fields it `requires` and `produces`, and a pure
function `run(ctx, cfg, reporter) -> PassResult`. Passes keep no state between
runs and touch no globals; the registry maps names to specs.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from tfcompile.pipeline.context import FIELDS, Context


@dataclass(frozen=True)
class PassResult:
    ctx: Context
    stats: Mapping[str, Any] = field(default_factory=dict)  # JSON-able figures for the report


RunFn = Callable[[Context, Any, Any], PassResult]
# supports(recipe, cfg) -> None when the pass can run, else a reason string.
SupportsFn = Callable[[Any, Any], "str | None"]


@dataclass(frozen=True)
class PassSpec:
    name: str
    config: type  # frozen dataclass type
    requires: frozenset[str]
    produces: frozenset[str]
    run: RunFn
    doc: str
    supports: SupportsFn | None = None


REGISTRY: dict[str, PassSpec] = {}


def register_pass(name: str, *, config: type, requires=(), produces=(), supports=None):
    """Decorator: register `run` as pass `name`. Field names are checked here."""
    req, prod = frozenset(requires), frozenset(produces)
    bad = (req | prod) - FIELDS
    if bad:
        raise ValueError(f"pass {name!r} names unknown context fields {sorted(bad)}")
    if not (dataclasses.is_dataclass(config) and config.__dataclass_params__.frozen):
        raise TypeError(f"pass {name!r}: config must be a frozen dataclass")

    def wrap(fn: RunFn) -> RunFn:
        if name in REGISTRY:
            raise ValueError(f"pass {name!r} registered twice")
        doc = (fn.__doc__ or "").strip().splitlines()[0] if fn.__doc__ else ""
        REGISTRY[name] = PassSpec(name, config, req, prod, fn, doc, supports)
        return fn

    return wrap


def get_pass(name: str) -> PassSpec:
    _load_builtin_passes()
    try:
        return REGISTRY[name]
    except KeyError:
        from tfcompile.errors import RecipeError

        raise RecipeError(
            f"unknown pass {name!r}",
            hint="known passes: " + ", ".join(sorted(REGISTRY)),
        ) from None


def _load_builtin_passes() -> None:
    """Import the built-in pass modules once (explicit list, no package walking)."""
    import tfcompile.passes.builtin  # noqa: F401  (registers on import)
