"""`onnx`: write the staged artifact as an ONNX model under OUT/onnx/ (docs/onnx.md).

Scheduled by `--export onnx` (or any `onnx.*` setting, or `pack.export =
["onnx"]` in a recipe), after pack (and emit) and before manifest, so the
manifest lists onnx/model.onnx (and onnx/model.onnx.data) with their sha256
and `tfcompile verify` re-hashes them. Reads the tensors pack just wrote, so
the graph holds exactly the artifact's bytes.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from tfcompile.io.oserrors import write_error
from tfcompile.onnx_export.config import DEFAULT_OPSET, OnnxExportConfig
from tfcompile.onnx_export.source import ArtifactView, check_scheme, read_config
from tfcompile.pipeline.intents import SingleScheme
from tfcompile.pipeline.passes import PassResult, Unsupported, check, given, register_pass
from tfcompile.recipe import Recipe
from tfcompile.schemes import get_scheme


@dataclass(frozen=True)
class OnnxConfig:
    opset: int = DEFAULT_OPSET  # default-domain opset (23: FLOAT4E2M1; 24+: FLOAT8E8M0 MX scales)
    external_data: str = "auto"  # auto (external above ~1.9 GiB of weights) | always | never
    path: str = "onnx/model.onnx"  # inside the artifact; external data beside it as <name>.data


def _export_config(cfg: OnnxConfig) -> OnnxExportConfig:
    return OnnxExportConfig(opset=cfg.opset, external_data=cfg.external_data)


def _supports(recipe: Recipe, cfg: OnnxConfig) -> list[Unsupported]:
    reasons = check(_export_config(cfg).check)  # a bad opset / external_data
    p = PurePosixPath(cfg.path)
    if p.is_absolute() or ".." in p.parts or p.suffix != ".onnx" or p.parts[0] == "tfcompile":
        reasons.append(Unsupported(f"path {cfg.path!r} must be a relative .onnx path inside the artifact "
                                   "(not under tfcompile/)"))
    if recipe.format != "custom":  # the scheme alone decides FP8 2-D blocks and FP4 opsets: fail up front
        reasons += check(lambda: check_scheme(get_scheme(recipe.format), cfg.opset))
    return reasons


@register_pass("onnx", config=OnnxConfig, requires=("plan", "program", "artifact", "out_dir"),
               produces=("artifact",), supports=_supports, when=given("onnx"), ranks="root",
               intents=lambda c: (SingleScheme("onnx"),))
def onnx_export(ctx, cfg: OnnxConfig, reporter) -> PassResult:
    """Export the staged artifact to ONNX and add the files to the artifact's checksums."""
    out_dir = Path(ctx.out_dir)
    view = ArtifactView(out_dir, read_config(out_dir), ctx.plan.scheme,
                        {la["module"]: tuple(la["shape"]) for la in ctx.artifact.layers},
                        tuple(ctx.program.kv_modules))
    target = out_dir / cfg.path
    target.parent.mkdir(parents=True, exist_ok=True)
    from tfcompile.onnx_export.export import export_onnx  # lazy: onnx (~1 s), only when the pass runs

    try:
        res = export_onnx(view, target, _export_config(cfg), reporter)
    except OSError as e:  # disk full, permissions: a user error naming the file
        raise write_error(target, e) from e
    rel = str(PurePosixPath(cfg.path).parent)
    files = {str(PurePosixPath(rel) / name) if rel != "." else name: sha for name, sha in res.files.items()}
    art = ctx.artifact.with_files(files, views=("onnx",))
    stats = {"files": sorted(files), "opset": res.opset, "external_data": res.external_data,
             "initializers": res.initializers, "initializer_bytes": res.initializer_bytes,
             "custom_ops": list(res.custom_ops)}
    return PassResult(ctx.with_(artifact=art), stats)
