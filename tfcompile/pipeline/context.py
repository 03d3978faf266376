"""The typed, immutable context that passes read and extend.

Two kinds of facts, both named in a pass's `requires` / `produces` and checked by the manager
before anything runs:

- The core facts every run has, fields of `Context` typed with tfcompile/ir.py's types: where the
  run reads and writes (`source_path`, `out_dir`), what it runs (`recipe`), the model as loaded
  (`source`, `model`), what it quantizes (`plan`), the output tensors (`program`), the files
  written (`artifact`, `manifest`) and the processes (`world`). `None`: not produced yet. The
  quantization pipeline is these; a pass reads them as attributes (`ctx.plan`).
- A pass's own facts (the layout plan, the calibration statistics, the evaluation, ...): typed keys
  (tfcompile/facts.py `Fact`) declared by the pass's package, held in `facts` by name. A pass reads
  one with `ctx[KEY]` (a missing fact raises `MissingFact`, naming it and the passes that produce
  it) or `ctx.get(KEY)` (None when absent: a fact it may do without), and adds it with
  `ctx.add(KEY, value)` (its type checked). The core names none of them (docs/design.md "The
  context").

Passes return a new context (`with_`, `add`); nothing is mutated.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, TypeVar

from tfcompile.dist.world import World
from tfcompile.errors import TfcompileError
from tfcompile.facts import FACTS, PRODUCERS, Fact
from tfcompile.io.checkpoint import Checkpoint
from tfcompile.io.jsonfile import JsonDict, JsonValue
from tfcompile.ir import ArtifactInfo, ModelInfo, Program, QuantPlan
from tfcompile.recipe import Recipe

T = TypeVar("T")

# Facts present before the first pass runs (the manager's starting set).
INITIAL_FIELDS = frozenset({"source_path", "out_dir", "recipe"})


class MissingFact(TfcompileError):
    """A pass read a fact no earlier pass produced (it did not declare it in `requires`: a bug)."""


@dataclass(frozen=True)
class Context:
    source_path: Path
    out_dir: Path | None  # staging directory the artifact is built in (atomic rename later)
    recipe: Recipe
    source: Checkpoint | None = None  # memory-mapped (an OverlayCheckpoint after distill)
    model: ModelInfo | None = None  # architecture facts
    plan: QuantPlan | None = None  # what is quantized, in which groups
    program: Program | None = None  # lazy output tensors, in write order
    artifact: ArtifactInfo | None = None  # files written (with sha256), per-layer figures
    manifest: JsonDict | None = None  # tfcompile/manifest.json's content
    world: World | None = None  # under torchrun: rank, size, store (tfcompile/dist); None = one process
    facts: Mapping[str, object] = field(default_factory=dict)  # the passes' own facts, by Fact name
    pass_stats: Mapping[str, Mapping[str, JsonValue]] = field(default_factory=dict)

    def with_(self, **changes: object) -> "Context":
        """A copy with core fields replaced (`ctx.with_(program=p)`)."""
        unknown = set(changes) - FIELDS - {"pass_stats"}
        if unknown:
            hint = [n for n in sorted(unknown) if n in FACTS]
            raise AttributeError(f"Context has no field(s) {sorted(unknown)}"
                                 + (f" ({', '.join(hint)}: a pass's fact: ctx.add(KEY, value))" if hint else ""))
        return dataclasses.replace(self, **changes)

    def add(self, key: Fact[T], value: T) -> "Context":
        """A copy holding fact `key` = `value` (a `key.type`, else TypeError)."""
        if FACTS.get(key.name) is not key or key.name in FIELDS:
            raise KeyError(f"fact {key.name!r} is not declared (tfcompile/facts.py fact()), or names a core field")
        return dataclasses.replace(self, facts={**self.facts, key.name: key.check(value)})

    def get(self, key: Fact[T]) -> T | None:
        """Fact `key`'s value, or None if no pass produced it."""
        return self.facts.get(key.name)  # type: ignore[return-value]

    def __getitem__(self, key: Fact[T]) -> T:
        """Fact `key`'s value; a MissingFact naming it and its producers if no pass produced it."""
        if key.name not in self.facts:
            makers = " or ".join(f"'{p}'" for p in PRODUCERS.get(key.name, ())) or "no registered pass"
            raise MissingFact(f"the context has no fact '{key.name}' ({key.type.__name__}: {key.doc}); it is "
                              f"produced by {makers}, which did not run before this pass",
                              hint=f"declare '{key.name}' in the reading pass's requires= so the schedule is "
                                   "checked before anything runs, or read it with ctx.get() if it is optional")
        return self.facts[key.name]  # type: ignore[return-value]

    def present(self) -> frozenset[str]:
        """Names of the core fields and facts that hold a value."""
        return frozenset(f for f in FIELDS if getattr(self, f) is not None) | frozenset(self.facts)

    def value(self, name: str) -> object:
        """A core field's or a fact's value by name (None: absent): the manager's generic access."""
        return getattr(self, name) if name in FIELDS else self.facts.get(name)

    def with_named(self, values: Mapping[str, object]) -> "Context":
        """A copy with core fields and facts set by name (a root-only pass's results on other ranks)."""
        core = {n: v for n, v in values.items() if n in FIELDS}
        ctx = self.with_(**core)
        for n, v in values.items():
            if n not in FIELDS:
                ctx = ctx.add(FACTS[n], v)
        return ctx


FIELDS = frozenset(f.name for f in dataclasses.fields(Context)) - {"pass_stats", "facts"}


def known(name: str) -> bool:
    """Whether `name` is a core field or a declared fact (register_pass checks requires/produces)."""
    return name in FIELDS or name in FACTS
