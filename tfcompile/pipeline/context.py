"""The typed, immutable context that passes read and extend.

Every fact a pass can produce is a field here; `None` means "not produced
yet". A pass declares the field names it `requires` and `produces`, and the
manager checks the schedule against those names before anything runs. Passes
return a new context with `ctx.with_(field=value)`; nothing is mutated.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

# Facts present before the first pass runs (the manager's starting set).
INITIAL_FIELDS = frozenset({"source_path", "out_dir", "recipe"})


@dataclass(frozen=True)
class Context:
    source_path: Path
    out_dir: Path | None  # staging directory the artifact is built in (atomic rename later)
    recipe: Any  # tfcompile.recipe.Recipe (Any avoids an import cycle)
    source: Any = None  # tfcompile.io.checkpoint.Checkpoint, memory-mapped
    model: Any = None  # passes.model_info.ModelInfo: architecture facts
    plan: Any = None  # passes.select.QuantPlan: what is quantized, in which groups
    calib: Any = None  # calibration.stats.CalibStats: activation amax per module
    program: Any = None  # passes.quantize.Program: lazy output tensors, in write order
    artifact: Any = None  # passes.pack.ArtifactInfo: files written, per-layer figures
    manifest: Any = None  # dict: tfcompile/manifest.json as written
    verify: Any = None  # tfcompile.artifact.verify.VerifyReport
    world: Any = None  # tfcompile.dist.World under torchrun (rank, size, store); None = one process
    pass_stats: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)

    def with_(self, **changes: Any) -> "Context":
        unknown = set(changes) - FIELDS - {"pass_stats"}
        if unknown:
            raise AttributeError(f"Context has no field(s) {sorted(unknown)}")
        return dataclasses.replace(self, **changes)

    def present(self) -> frozenset[str]:
        """Names of fields that hold a value."""
        return frozenset(f for f in FIELDS if getattr(self, f) is not None)


FIELDS = frozenset(f.name for f in dataclasses.fields(Context)) - {"pass_stats"}
