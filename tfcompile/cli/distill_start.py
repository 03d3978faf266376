"""`tfcompile distill --init gptq`: the GPTQ artifact the student starts from, built by the same command.

The start is this run's own recipe without the distill pass (and without the passes that only
report on or export an artifact), with `quantize.algorithm=gptq` set last: the same format,
selection, calibration and block-scale rule (four over six) as the distillation's
(`options_recipe(run, without=...)`, tfcompile/recipe/build.py). It is packed as any `tfcompile
quantize` artifact, into a work folder next to OUT (removed after the run) or, with
--resume-dir, into RESUME_DIR/init-gptq (claimed with the start's recipe and the checkpoint's
identity, tfcompile/io/resume.py; a rerun reuses it). The distill pass gets its path as
`distill.init_artifact`, a runtime field: the recorded recipe says `init: gptq`, and the
manifest's `distill.init` names the start's manifest by hash (tfcompile/distill/run.py). So the
one command writes what `tfcompile quantize --algorithm gptq ... -o A` then `tfcompile distill
--init A ...` write (tests/distill/test_distill_start.py).
"""

from __future__ import annotations

import dataclasses
import os
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from tfcompile.cli.runner import ArtifactRun
from tfcompile.errors import RecipeError
from tfcompile.io.locks import work_dir
from tfcompile.recipe.options import RunOptions
from tfcompile.schemes import DISTILL_STARTS

# passes the start does not need: it is read back as weights, never served, evaluated or exported
NOT_IN_START = ("distill", "emit", "emit_cutlass", "onnx", "eval", "report")
START = "init-{}"  # RESUME_DIR/init-gptq


@contextmanager
def distill_start(job: ArtifactRun, run: RunOptions) -> Iterator[dict | None]:
    """Build the start artifact when job's distill.init names an algorithm, and point job's recipe
    at it for the `with` body; yields the start's --json record (None: nothing to build)."""
    from tfcompile.recipe.build import options_recipe  # lazy: the pass registry imports torch

    cfg = job.recipe.config("distill")
    if cfg.init not in DISTILL_STARTS or cfg.init_artifact:
        yield None
        return
    if int(os.environ.get("WORLD_SIZE", "1") or 1) > 1:  # every rank would build (and race on) the start
        raise RecipeError(f"distill.init {cfg.init} under torchrun: the start artifact is built by one "
                         "process", hint=f"build it first: `tfcompile quantize --algorithm {cfg.init} ... -o A` "
                                         "(or under torchrun), then `torchrun ... tfcompile distill --init A`")
    from tfcompile.pipeline import manager  # lazy: the pipeline imports torch

    start_run = dataclasses.replace(run, sets=(*run.sets, f"quantize.algorithm={cfg.init}"), skip=(), until=None)
    recipe = options_recipe(start_run, without=NOT_IN_START)
    manager.validate(recipe)  # both runs' schedules and settings, before minutes of GPTQ
    manager.validate(_with_init_artifact(job.recipe, Path("start")))
    with _start_dir(job, recipe, cfg) as (where, kept):
        out = where / "artifact"
        t0, reused = time.perf_counter(), (out / "tfcompile" / "manifest.json").is_file()
        if not reused:
            if not job.art.quiet:
                job.console.print(f"distill.init {cfg.init}: building the start artifact in {out}", markup=False)
            ctx = job.api.run_pipeline(job.art.model, out, recipe, overwrite=True, reporter=job.reporter)
        record = {"init": cfg.init, "recipe": recipe.to_dict(), "artifact": str(out) if kept else None,
                  "reused": reused, "wall_s": round(time.perf_counter() - t0, 2),
                  "passes": None if reused else ctx.pass_stats}
        main = job.recipe
        job.recipe = _with_init_artifact(main, out)
        try:
            yield record
        finally:
            job.recipe = main


@contextmanager
def _start_dir(job: ArtifactRun, recipe, cfg) -> Iterator[tuple[Path, bool]]:
    """(folder for the start, whether it outlives the run): RESUME_DIR/init-ALG, claimed for this
    start and checkpoint, or a work folder next to OUT (swept if the run dies: io/locks.py)."""
    from tfcompile.io.checkpoint import open_checkpoint  # lazy: safetensors and torch
    from tfcompile.io.resume import claim, source_identity  # lazy: torch

    if cfg.resume_dir:
        src = open_checkpoint(job.art.model)
        try:
            fingerprint = {"recipe": recipe.to_dict(), **source_identity(src)}
        finally:
            src.close()
        yield claim(Path(cfg.resume_dir) / START.format(cfg.init), fingerprint), True
        return
    parent = Path(job.art.out).absolute().parent
    parent.mkdir(parents=True, exist_ok=True)
    with work_dir(".tfcompile-distill-", parent) as tmp:
        yield Path(tmp), False


def _with_init_artifact(recipe, path: Path):
    """`recipe` with the distill pass's runtime field init_artifact = path (the recorded recipe is unchanged)."""
    passes = tuple(dataclasses.replace(p, config=dataclasses.replace(p.config, init_artifact=str(path)))
                   if p.name == "distill" else p for p in recipe.passes)
    return dataclasses.replace(recipe, passes=passes)
