"""The pass manager: check the whole schedule, then run it pass by pass.

`validate` walks the recipe without running anything: every pass's `requires`
must be in the starting context or produced by an earlier pass, and no pass's
`supports` may report a reason it cannot run (every reason of every pass is
reported at once). `run` executes, times each pass, checks that it produced
what it declared, and on failure names the failing pass and the passes that ran
before it; after the last pass it calls the passes' `finish` hooks in order.
"""

from __future__ import annotations

import errno
import time

from tfcompile.errors import RecipeError, TfcompileError
from tfcompile.io.oserrors import write_error
from tfcompile.pipeline.context import INITIAL_FIELDS, Context
from tfcompile.pipeline.passes import REGISTRY, PassSpec, Unsupported, get_pass
from tfcompile.pipeline.ranks import run_pass
from tfcompile.recipe import Recipe
from tfcompile.reporter import NullReporter, Reporter


_ENVIRONMENT = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM, errno.EIO,
                errno.ENAMETOOLONG, errno.ELOOP, errno.EMFILE, errno.ENFILE}
_PATHS = {errno.ENAMETOOLONG, errno.ELOOP}  # about a path given, read or written


class PassFailed(TfcompileError):
    """A pass raised. Keeps the inner error's exit code and hint."""

    def __init__(self, name: str, before: list[str], inner: BaseException):
        if isinstance(inner, OSError) and inner.errno in _ENVIRONMENT:  # the machine, not a bug: exit 1
            inner = write_error(inner.filename or "the output", inner, "use" if inner.errno in _PATHS else "write")
        msg = str(inner.message if isinstance(inner, TfcompileError) else f"{type(inner).__name__}: {inner}")
        ran = ", ".join(before) or "none"
        super().__init__(f"pass '{name}' failed: {msg} (passes run before it: {ran})",
                         getattr(inner, "hint", None) or f"rerun with --until {name} to reproduce")
        self.exit_code = getattr(inner, "exit_code", 2)
        self.pass_name = name
        self.inner = inner


def writes_artifact(recipe: Recipe) -> bool:
    """Whether a pass of `recipe` writes the artifact (produces the `artifact` core field:
    `pack`, unless --until stops before it): the run then needs its output directory."""
    return any("artifact" in get_pass(n).produces for n in recipe.names())


def validate(recipe: Recipe) -> list[PassSpec]:
    """Check the schedule statically; return the pass specs in order."""
    available = set(INITIAL_FIELDS)
    specs, seen = [], []
    problems: list[tuple[str, Unsupported]] = []
    for entry in recipe.passes:
        spec = get_pass(entry.name)
        missing = sorted(spec.requires - available)
        if missing:
            makers = _producers(missing)
            raise RecipeError(
                f"pass '{spec.name}' requires {', '.join(missing)}, which no earlier pass produces"
                f" (passes before it: {', '.join(seen) or 'none'})",
                hint=f"schedule {makers} before '{spec.name}', or drop it from --skip/--until",
            )
        if spec.supports is not None:
            reasons = spec.supports(recipe, entry.config)
            if not isinstance(reasons, list):  # e.g. a pass written for the old API (a str or None)
                raise TypeError(f"pass {spec.name!r}: supports() must return a list of Unsupported, "
                                f"got {type(reasons).__name__}")
            problems += [(spec.name, u) for u in reasons]
        available |= spec.produces
        specs.append(spec)
        seen.append(spec.name)
    if problems:
        raise _unsupported(problems)
    return specs


def _unsupported(problems: list[tuple[str, Unsupported]]) -> RecipeError:
    """One error naming every reason; the first reason's hint (each is listed in the message)."""
    lines = [f"pass '{name}' cannot run: {u.reason}" for name, u in problems]
    name, first = problems[0]
    hint = first.hint or f"change the recipe or --skip {name}"
    if len(problems) > 1:
        hint += f" (and {len(problems) - 1} more reason{'s' if len(problems) > 2 else ''} above)"
    return RecipeError("; ".join(lines), hint=hint)


def _producers(fields: list[str]) -> str:
    names = sorted({s.name for s in REGISTRY.values() if s.produces & set(fields)})
    return " or ".join(f"'{n}'" for n in names) or "a pass that produces them"


def run(ctx: Context, recipe: Recipe, reporter: Reporter | None = None) -> Context:
    """Run `recipe` over `ctx`; returns the final context with per-pass stats."""
    reporter = reporter or NullReporter()
    specs = validate(recipe)
    stats: dict[str, dict] = dict(ctx.pass_stats)
    done: list[str] = []
    for spec, entry in zip(specs, recipe.passes):
        reporter.pass_started(spec.name)
        t0 = time.perf_counter()
        try:
            if ctx.world is None:
                result = spec.run(ctx, entry.config, reporter)
            else:  # torchrun: root-only passes, barriers, failure records (pipeline/ranks.py)
                result = run_pass(ctx.world, spec, ctx, entry.config, reporter)
        except (KeyboardInterrupt, PassFailed):
            raise
        except BaseException as e:  # noqa: BLE001 - re-raised with the pass named
            reporter.pass_failed(spec.name)
            raise PassFailed(spec.name, done, e) from e
        seconds = time.perf_counter() - t0
        lost = sorted(f for f in spec.produces if result.ctx.value(f) is None)
        if lost:
            raise PassFailed(spec.name, done, RuntimeError(f"did not produce {', '.join(lost)}"))
        stats[spec.name] = {"seconds": round(seconds, 4), **dict(result.stats)}
        ctx = result.ctx.with_(pass_stats=dict(stats))
        reporter.pass_finished(spec.name, seconds, result.stats)
        done.append(spec.name)
    for spec in specs:  # the files written once (manifest, report); by rank 0 under torchrun
        if spec.finish is not None and (ctx.world is None or ctx.world.is_root):
            try:
                ctx = spec.finish(ctx)
            except (KeyboardInterrupt, PassFailed):
                raise
            except BaseException as e:  # noqa: BLE001 - re-raised with the pass named
                raise PassFailed(spec.name, done, e) from e
    return ctx
