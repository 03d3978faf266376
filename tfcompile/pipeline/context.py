"""The typed, immutable context that passes read and extend.

Every fact a pass can produce is a field here, typed with the types of tfcompile/ir.py
and the libraries that define them; `None` means "not produced yet". A pass declares the
field names it `requires` and `produces`, and the manager checks the schedule against
those names before anything runs. Passes return a new context with `ctx.with_(field=value)`;
nothing is mutated.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

from tfcompile.artifact.verify import VerifyReport
from tfcompile.dist.world import World
from tfcompile.io.checkpoint import Checkpoint
from tfcompile.io.jsonfile import JsonDict, JsonValue
from tfcompile.ir import ArtifactInfo, CalibStats, ModelInfo, Program, QuantPlan
from tfcompile.layout.plan import LayoutPlan
from tfcompile.recipe import Recipe

# Facts present before the first pass runs (the manager's starting set).
INITIAL_FIELDS = frozenset({"source_path", "out_dir", "recipe"})


@dataclass(frozen=True)
class Context:
    source_path: Path
    out_dir: Path | None  # staging directory the artifact is built in (atomic rename later)
    recipe: Recipe
    source: Checkpoint | None = None  # memory-mapped (an OverlayCheckpoint after distill)
    model: ModelInfo | None = None  # architecture facts
    plan: QuantPlan | None = None  # what is quantized, in which groups
    layout: LayoutPlan | None = None  # the engine layout (--layout): fusions, row orders, the view
    calib: CalibStats | None = None  # activation amax per module, KV amax, Hessians, AWQ statistics
    program: Program | None = None  # lazy output tensors, in write order
    artifact: ArtifactInfo | None = None  # files written (with sha256), per-layer figures
    cutlass: JsonDict | None = None  # emit_cutlass: what was generated and compiled (manifest "cutlass")
    evaluation: JsonDict | None = None  # eval: the figures and gates (manifest "eval")
    manifest: JsonDict | None = None  # tfcompile/manifest.json's content
    verify: VerifyReport | None = None
    world: World | None = None  # under torchrun: rank, size, store (tfcompile/dist); None = one process
    pass_stats: Mapping[str, Mapping[str, JsonValue]] = field(default_factory=dict)

    def with_(self, **changes: object) -> "Context":
        unknown = set(changes) - FIELDS - {"pass_stats"}
        if unknown:
            raise AttributeError(f"Context has no field(s) {sorted(unknown)}")
        return dataclasses.replace(self, **changes)

    def present(self) -> frozenset[str]:
        """Names of fields that hold a value."""
        return frozenset(f for f in FIELDS if getattr(self, f) is not None)


FIELDS = frozenset(f.name for f in dataclasses.fields(Context)) - {"pass_stats"}
