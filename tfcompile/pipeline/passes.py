"""The pass API and registry.

A pass is a name, a frozen config dataclass (unknown keys are rejected when a
recipe is parsed), the facts it `requires` and `produces` (the context's core field names, or
the `Fact` keys its package declares: tfcompile/facts.py), and a pure
function `run(ctx, cfg, reporter) -> PassResult`. Passes keep no state between
runs and touch no globals; the registry maps names to specs. It is filled by
importing the pass modules (`tfcompile.passes.builtin`), which the entry points
(tfcompile.api, the CLI) do; the pipeline core imports no pass.

The standard pipeline (`tfcompile quantize`, `distill`) is one ordered list of pass names,
`SCHEDULE`, set by whoever registers the passes (`tfcompile.passes.builtin.STANDARD`; the core
names no pass); a registered pass missing from it runs only in a recipe's explicit list.
Each pass declares whether the standard pipeline runs it:
- `when(selection)`: whether it runs, from the format and the settings given
  (None: always);
- `implies(selection)`: settings the format and the given settings imply, in other passes
  (GPTQ's Hessians from `calibrate`) or its own (a default that depends on the format),
  applied under the user's own; an implied pass is scheduled too;
- `supports(recipe, cfg)`: every reason the pass cannot run with this recipe
  (`Unsupported`, with a hint), all at once; [] when it can. It never raises.
A pass may also `finish` the run: after the last pass has run, the manager calls each
scheduled pass's `finish(ctx)` in order (the manifest pass writes the manifest there, once,
from the facts every pass returned).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from tfcompile.errors import RecipeError, UserError
from tfcompile.io.jsonfile import JsonValue
from tfcompile.facts import PRODUCERS, Fact
from tfcompile.pipeline.context import FIELDS, Context, known
from tfcompile.recipe import Recipe
from tfcompile.reporter import Reporter
from tfcompile.schemes import Scheme

Settings = Mapping[str, Mapping[str, Any]]  # pass name -> {field: value} given for it


@dataclass(frozen=True)
class PassResult:
    ctx: Context
    stats: Mapping[str, JsonValue] = field(default_factory=dict)  # JSON-able figures for the report


@dataclass(frozen=True)
class Unsupported:
    """One reason a pass cannot run with a recipe, and what to do about it."""
    reason: str
    hint: str | None = None


@dataclass(frozen=True)
class Selection:
    """What decides the standard pipeline: the format's scheme (None: no format) and every
    setting given, by pass (recipe file, CLI options and --set, merged; an option with no
    value, such as --export onnx, gives its pass an empty table)."""
    scheme: Scheme | None
    settings: Settings

    def given(self, name: str) -> bool:
        """Any setting was given for pass `name`."""
        return name in self.settings

    def value(self, name: str, key: str) -> Any:
        return self.settings.get(name, {}).get(key)


RunFn = Callable[[Context, Any, Reporter], PassResult]
SupportsFn = Callable[[Recipe, Any], "list[Unsupported]"]
WhenFn = Callable[[Selection], bool]
ImpliesFn = Callable[[Selection], "dict[str, dict[str, Any]]"]
FinishFn = Callable[[Context], Context]
IntentsFn = Callable[[Any], tuple]  # cfg -> the facts its settings promise (tfcompile/pipeline/intents.py)


@dataclass(frozen=True)
class PassSpec:
    name: str
    config: type  # frozen dataclass type
    requires: frozenset[str]
    produces: frozenset[str]
    run: RunFn
    doc: str
    supports: SupportsFn | None = None
    when: WhenFn | None = None  # None: every standard pipeline runs it
    implies: ImpliesFn | None = None
    finish: FinishFn | None = None  # called with the final context after the last pass
    # under torchrun: "all" (every rank runs it and divides its own work) or "root" (rank 0 runs
    # it, the others receive the facts it produces: passes that only write files or
    # read the finished artifact; pipeline/ranks.py)
    ranks: str = "all"
    intents: IntentsFn | None = None  # what other passes may know of it before it runs
    # unscheduled(scheme) -> (why, hint): why a format's standard pipeline leaves the pass out, for
    # settings given to it anyway (recipe/build.py); those that only state a run-wide policy (its
    # `runtime` fields, e.g. calibrate.strict) or come from --preset are moot there. None: an error
    # "not in this pipeline" like any pass outside the pipeline
    unscheduled: Callable[[Any], tuple[str, str]] | None = None


REGISTRY: dict[str, PassSpec] = {}
SCHEDULE: list[str] = []  # the standard pipeline's order (set_schedule); names, not specs


def set_schedule(names) -> None:
    """Set the standard pipeline's order: every name a registered pass, each once."""
    names = list(names)
    unknown = [n for n in names if n not in REGISTRY]
    if unknown or len(set(names)) != len(names):
        raise ValueError(f"schedule names unregistered or repeated passes: {unknown or names}")
    SCHEDULE[:] = names


def register_pass(name: str, *, config: type, requires=(), produces=(), supports: SupportsFn | None = None,
                  when: WhenFn | None = None, implies: ImpliesFn | None = None, finish: FinishFn | None = None,
                  ranks: str = "all", intents: IntentsFn | None = None,
                  unscheduled: Callable[[Any], tuple[str, str]] | None = None):
    """Decorator: register `run` as pass `name`. `requires` / `produces`: core field names or Fact
    keys (held by name: a fact's name is unique), checked here."""
    req, prod = _names(requires), _names(produces)
    if ranks not in ("all", "root"):
        raise ValueError(f"pass {name!r}: ranks must be 'all' or 'root', not {ranks!r}")
    bad = {n for n in req | prod if not known(n)}
    if bad:
        raise ValueError(f"pass {name!r} names unknown context fields or undeclared facts {sorted(bad)}")
    if not (dataclasses.is_dataclass(config) and config.__dataclass_params__.frozen):
        raise TypeError(f"pass {name!r}: config must be a frozen dataclass")

    def wrap(fn: RunFn) -> RunFn:
        if name in REGISTRY:
            raise ValueError(f"pass {name!r} registered twice")
        doc = (fn.__doc__ or "").strip().splitlines()[0] if fn.__doc__ else ""
        REGISTRY[name] = PassSpec(name, config, req, prod, fn, doc, supports, when, implies, finish, ranks,
                                  intents, unscheduled)
        for n in sorted(prod - FIELDS):
            PRODUCERS.setdefault(n, []).append(name)
        return fn

    return wrap


def _names(keys) -> frozenset[str]:
    """Core field names and Fact keys -> names (a str that names a fact must be its declared name)."""
    if isinstance(keys, (str, Fact)):
        raise TypeError("requires= / produces= take a sequence of names or Fact keys, not one")
    return frozenset(k.name if isinstance(k, Fact) else k for k in keys)


def recipe_intents(recipe: Recipe | None, kind: type) -> list:
    """Every fact of type `kind` that the recipe's passes promise, in schedule order
    (tfcompile/pipeline/intents.py): how a pass learns what another will do without naming it."""
    if recipe is None:
        return []
    found = []
    for entry in recipe.passes:
        spec = REGISTRY.get(entry.name)
        if spec is not None and spec.intents is not None:
            found += [f for f in spec.intents(entry.config) if isinstance(f, kind)]
    return found


def recipe_intent(recipe: Recipe | None, kind: type, default=None):
    """The first fact of type `kind` the recipe promises, else `default`."""
    return next(iter(recipe_intents(recipe, kind)), default)


def get_pass(name: str) -> PassSpec:
    try:
        return REGISTRY[name]
    except KeyError:
        raise RecipeError(
            f"unknown pass {name!r}",
            hint=("known passes: " + ", ".join(sorted(REGISTRY))) if REGISTRY else
            "no pass is registered: import tfcompile.api (it registers the built-in passes)",
        ) from None


def given(name: str) -> WhenFn:
    """`when`: the pass runs when any setting was given for it (its CLI option or a recipe table)."""
    return lambda sel: sel.given(name)


def check(fn: Callable[..., Any], *args: Any) -> list[Unsupported]:
    """Run a validator that raises a UserError (a RecipeError, a toolchain error) and turn what it
    raises into a reason: how `supports` functions reuse checks shared with the passes' runs."""
    try:
        fn(*args)
    except UserError as e:
        return [Unsupported(e.message, e.hint)]
    return []
