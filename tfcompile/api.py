"""Library entry points; the CLI is a thin layer over these.

Importing this module registers the built-in passes (tfcompile.passes.builtin): the
pipeline core imports no pass, its entry points do (docs/design.md "Layers").
"""

from __future__ import annotations

from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

import tfcompile.passes.builtin  # noqa: F401  (registers the built-in passes)
from tfcompile.artifact.rejected import keep_rejected, rejected_path
from tfcompile.artifact.signing import load_private_key, sign_artifact
from tfcompile.dist import world as dist_world
from tfcompile.dist.devices import cuda_index
from tfcompile.dist.world import World
from tfcompile.errors import TfcompileError, UserError
from tfcompile.io.atomic import atomic_output_dir
from tfcompile.io.locks import sweep_work_dirs
from tfcompile.io.paths import allowed_roots
from tfcompile.io.signals import unwinding
from tfcompile.pipeline import manager
from tfcompile.pipeline.context import Context
from tfcompile.pipeline.distributed import run_distributed
from tfcompile.recipe import Recipe
from tfcompile.recipe.build import build_recipe
from tfcompile.reporter import Reporter


def run_pipeline(model_dir: Path, out_dir: Path | None, recipe: Recipe, *,
                 overwrite: bool = False, reporter: Reporter | None = None,
                 sign_key: Path | None = None, world: World | None = None) -> Context:
    """Validate and run `recipe` on `model_dir`.

    When the recipe packs an artifact, it is built in a temporary sibling of
    `out_dir` and renamed into place only if every pass succeeded
    (tfcompile/io/atomic.py: output rules, lock, publish). A recipe cut before
    `pack` (--until) writes nothing. `sign_key`: an ed25519 private key file;
    the manifest is signed last, in the staging dir (tfcompile/artifact/signing.py).
    Under torchrun (or with a `world` of several ranks) every rank runs it:
    tfcompile/pipeline/distributed.py.
    """
    manager.validate(recipe)  # fail before touching the output directory
    packs = manager.writes_artifact(recipe) and out_dir is not None
    signer = _signer(sign_key, out_dir, packs)  # a bad key fails before any work
    warn = getattr(reporter, "warn", None)
    world = world if world is not None else dist_world.current()
    for note in sweep_work_dirs(Path(out_dir).absolute().parent if out_dir is not None else None):
        (warn or (lambda m: None))(note)  # spills, rotate and distill copies of dead runs (io/locks.py)
    for entry in recipe.passes:  # --device cuda:99 without that GPU: refused even if nothing would use it
        if isinstance(getattr(entry.config, "device", None), str):
            cuda_index(entry.config.device, world)
    if world.distributed:
        return run_distributed(world, model_dir, out_dir if packs else None, recipe, reporter=reporter,
                               open_output=lambda: atomic_output_dir(out_dir, overwrite=overwrite,
                                                                     protect=allowed_roots(Path(model_dir)), warn=warn),
                               finish=(lambda staging: sign_artifact(staging, signer)) if signer else None,
                               reject=lambda err, staging: _keep_rejected(err, staging, Path(out_dir), warn, world))
    if not packs:
        ctx = Context(source_path=Path(model_dir), out_dir=None, recipe=recipe)
        return manager.run(ctx, recipe, reporter)
    warn = reporter.warn if reporter is not None else None
    with atomic_output_dir(out_dir, overwrite=overwrite, protect=allowed_roots(Path(model_dir)), warn=warn) as staging:
        ctx = Context(source_path=Path(model_dir), out_dir=staging, recipe=recipe)
        try:
            ctx = manager.run(ctx, recipe, reporter)
        except TfcompileError as e:  # a missed --eval gate: keep the staged artifact at OUT.rejected
            _keep_rejected(e, staging, Path(out_dir), warn)
            raise
        if signer is not None:
            sign_artifact(staging, signer)
    return ctx.with_(out_dir=Path(out_dir))


def _keep_rejected(err: BaseException, staging: Path, out_dir: Path, warn, world: World | None = None) -> None:
    """The eval pass' GateFailed carries the would-be manifest (`rejected_manifest`); keep the
    artifact with it at OUT.rejected and say so in the error (and its --json report). Under
    torchrun every rank missed the same gate: rank 0 keeps it (every rank's files are in the
    staging directory since pack), the others wait for it and name the same path."""
    inner = getattr(err, "inner", err)
    manifest = getattr(inner, "rejected_manifest", None)
    if manifest is None or not isinstance(err, TfcompileError):
        return
    world = world if world is not None else dist_world.LOCAL
    if world.is_root:
        if world.distributed:  # from the share on, a peer may exit and torchrun SIGTERM us: finish
            unwinding()
        kept = keep_rejected(staging, out_dir, manifest)
        world.share("rejected", None if kept is None else str(kept))
    else:
        shared = world.fetch("rejected")
        kept = None if shared is None else Path(shared)
    if kept is None:
        (warn or (lambda m: None))(f"{rejected_path(out_dir)} exists and is not an artifact: the rejected "
                                   "artifact was not kept")
        return
    err.message += f"; the rejected artifact is kept at {kept}"
    err.args = (err.message,)
    err.hint = f"{err.hint}; inspect it: tfcompile report {kept}" if err.hint else None
    report = getattr(inner, "report", None)
    if isinstance(report, dict):
        report["rejected"] = str(kept)


def _signer(sign_key: Path | None, out_dir: Path | None, packs: bool) -> Ed25519PrivateKey | None:
    if sign_key is None:
        return None
    if not packs:
        raise UserError("--sign needs an artifact, but this run writes none (--until or --skip cut pack)",
                        hint="drop --sign, or let the pipeline run through pack")
    if Path(sign_key).resolve().is_relative_to(Path(out_dir).resolve()):
        raise UserError(f"the signing key {sign_key} is inside the output directory {out_dir}",
                        hint="keep keys outside artifacts: --overwrite would delete it, and it must never ship")
    return load_private_key(sign_key)


def quantize(model_dir, out_dir, fmt: str = "nvfp4", **recipe_options) -> Context:
    """`tfcompile quantize` as a function: `quantize("model/", "out/", "nvfp4a16")`."""
    overwrite = recipe_options.pop("overwrite", False)
    recipe = build_recipe(fmt=fmt, **recipe_options)
    return run_pipeline(Path(model_dir), Path(out_dir), recipe, overwrite=overwrite)
