"""Typed keys for the facts passes hand one another through the pipeline's context.

A `Fact` is a name and a type, declared once by the package that owns the fact: next to the pass
that produces it when no other pass reads it (emit_cutlass's `CUTLASS`, eval's `EVALUATION`), in
the library that both the producer and its readers import otherwise (the layout plan's `LAYOUT` in
tfcompile/layout, the calibration statistics' `CALIB` in calibration/). A pass names the facts it
`requires` and `produces` (tfcompile/pipeline/passes.py `register_pass`), the manager checks the
schedule against them, and the context (tfcompile/pipeline/context.py) stores and type-checks
their values; the pipeline core names none, so a pass with a new fact touches no core module
(tests/test_toy_fact.py).

A fact may also say what it adds to the manifest (`manifest(ctx, value) -> {section: JSON}`,
tfcompile/manifest_doc.py merges the sections of every fact present). This module is at the bottom
of the import layers (standard library only), so every package can declare a fact.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Generic, TypeVar

T = TypeVar("T")

ManifestFn = Callable[[Any, Any], "dict[str, Any]"]  # (context, the fact's value) -> manifest sections


@dataclass(frozen=True, eq=False)
class Fact(Generic[T]):
    """A typed key of the context: `ctx[KEY]` is a `KEY.type` (eq=False: a key is itself, by identity)."""

    name: str  # unique among facts and the context's own fields; the schedule checks use it
    type: type  # the value's type (checked when a pass stores it)
    doc: str  # what it holds, for error messages and docs
    manifest: ManifestFn | None = field(default=None, repr=False)  # its manifest sections, if any
    owner: str = ""  # the module that declared it (for messages)

    def __post_init__(self) -> None:
        if not self.name.isidentifier():
            raise ValueError(f"fact name {self.name!r} is not an identifier")
        first = FACTS.get(self.name)
        if first is not None and (first.owner, first.type) != (self.owner, self.type):  # same: a reload
            raise ValueError(f"fact {self.name!r} declared twice (first in {first.owner or '?'})")
        FACTS[self.name] = self

    def check(self, value: object) -> T:
        """`value` if it is a `self.type`, else a TypeError naming the fact."""
        if not isinstance(value, self.type):
            raise TypeError(f"fact {self.name!r} must be a {self.type.__name__}, not {type(value).__name__}")
        return value  # type: ignore[return-value]


FACTS: dict[str, Fact] = {}  # every declared fact by name (filled as the declaring modules import)

# name -> the passes that declared they produce it (register_pass fills it): error messages only
PRODUCERS: dict[str, list[str]] = {}


def fact(name: str, type_: type, doc: str, *, manifest: ManifestFn | None = None, owner: str = "") -> Fact:
    """Declare fact `name` of type `type_` (once; a second declaration of the name raises)."""
    return Fact(name, type_, doc, manifest, owner)
