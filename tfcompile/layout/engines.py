"""What each target engine's attention backend accepts, checked against a requested layout.

`all_rules()["engine/backend"]`, gathered from the engines' declarations (tfcompile/engines.py,
where each row names its sources), holds the KV-cache layouts, page (block) sizes, head dims, KV dtypes
and KV-scale granularity a backend reads, the RoPE convention its model code applies to a Hugging
Face Llama-family checkpoint, and whether the engine's view should carry fused q/k/v and gate/up
weights. `check(...)` validates a requested combination against it and raises RecipeError (exit 1)
with a hint naming what the backend does accept.
"""

from __future__ import annotations

from tfcompile.engines import ENGINES as SERVING_ENGINES, BackendRules
from tfcompile.errors import RecipeError
from tfcompile.schemes import KV_BY_DTYPE

KV_LAYOUTS = ("NHD", "HND")  # per page: [block_size, kv_heads, head_dim] vs [kv_heads, block_size, head_dim]
KV_DTYPES = ("bf16", "fp16", "fp8_e4m3", "nvfp4")
ROPE_KNOWN = ("half", "interleaved")  # RoPE conventions (tfcompile/layout/heads.py)


ENGINES = tuple(sorted(SERVING_ENGINES))  # the CLI's --layout choices (read when it starts)


def all_rules() -> dict[str, BackendRules]:
    """"engine/backend" -> its rules, from the engines declared now (tfcompile/engines.py)."""
    return {f"{e.name}/{b.backend}": b for e in SERVING_ENGINES.values() for b in e.backends}


def rules_for(engine: str, backend: str = "") -> BackendRules:
    """The rules of `engine`'s attention `backend` (its first, the default, when none is named)."""
    if engine not in SERVING_ENGINES:
        raise RecipeError(f"layout.target {engine!r} is not a known engine",
                          hint="--layout " + "|".join(sorted(SERVING_ENGINES)))
    backends = SERVING_ENGINES[engine].backends
    chosen = [b for b in backends if b.backend == (backend or backends[0].backend)]
    if not chosen:
        raise RecipeError(f"layout.backend {backend!r} is not a {engine} attention backend tfcompile knows",
                          hint=f"--set layout.backend=<{', '.join(b.backend for b in backends)}>")
    return chosen[0]


def block_ok(rule: str, n: int) -> bool:
    kind, _, arg = rule.partition(":")
    if n < 1:
        return False
    if kind == "multiple":
        return n % int(arg) == 0
    if kind == "pow2":
        return n & (n - 1) == 0
    if kind == "one_of":
        return n in {int(x) for x in arg.split(",")}
    return True


def _where(r: BackendRules) -> str:
    return f"{r.engine} ({r.backend})"


def check_block(r: BackendRules, block: int) -> None:
    if not block_ok(r.block_sizes, block):
        want = {"multiple": "a multiple of {}", "pow2": "a power of two", "one_of": "one of {}"}[
            r.block_sizes.split(":")[0]].format(r.block_sizes.partition(":")[2])
        raise RecipeError(f"KV block size {block} is not accepted by {_where(r)}: it must be {want}",
                          hint=f"--kv-block-size {r.default_block} (the backend's default)")


def check_layout(r: BackendRules, layout: str) -> None:
    if layout not in KV_LAYOUTS:
        raise RecipeError(f"--kv-layout {layout!r} is not NHD or HND", hint="--kv-layout NHD|HND")
    if layout not in r.kv_layouts:
        raise RecipeError(f"KV layout {layout} is not what {_where(r)} reads ({'/'.join(r.kv_layouts)})",
                          hint=f"--kv-layout {r.kv_layouts[0]}, or another --layout target")


def check_kv(r: BackendRules, dtype: str, per_head: bool) -> list[str]:
    """Raise for a KV dtype / scale granularity the backend cannot read; return warnings."""
    if dtype not in r.kv_dtypes:
        others = [f"{k.split('/')[0]} ({k.split('/')[1]})" for k, x in all_rules().items() if dtype in x.kv_dtypes]
        raise RecipeError(f"KV-cache dtype {dtype} is not supported by {_where(r)}",
                          hint=f"supported there: {', '.join(r.kv_dtypes)}; {dtype} KV: "
                               + (", ".join(others) or "no known target"))
    if not per_head or dtype not in KV_BY_DTYPE:
        return []
    if r.per_head_scales == "no":
        raise RecipeError(f"{_where(r)} reads one KV scale per layer; per-head scales (--kv-per-head) "
                          f"would be dropped or rejected at load",
                          hint="drop --kv-per-head for this target")
    if r.per_head_scales == "collapse":
        return [f"layout: {_where(r)} collapses per-head KV scales to their max over heads; "
                f"the descriptor records engine_scale 'max over heads'"]
    return []


def check_rope(r: BackendRules, rope: str) -> None:
    if rope not in r.rope:
        raise RecipeError(f"RoPE layout {rope} is not what {_where(r)} applies to this model "
                          f"({'/'.join(r.rope)}): its attention would read permuted q/k rows wrong",
                          hint=f"--set layout.rope={r.rope[0]}, or a target with an {rope} kernel "
                               + "(" + ", ".join(sorted({x.engine for x in all_rules().values() if rope in x.rope})) + ")")


def padded_head_dim(r: BackendRules, head_dim: int, requested: int = 0) -> int:
    """The head dim the KV cache stores: `requested`, or the smallest size the backend accepts."""
    if head_dim % r.head_dim_multiple:
        raise RecipeError(f"head_dim {head_dim} is not a multiple of {r.head_dim_multiple}, which "
                          f"{_where(r)} needs", hint="this model cannot use that backend")
    if requested:
        if requested < head_dim or requested % r.head_dim_multiple or (
                r.head_dims is not None and requested not in r.head_dims):
            allowed = ", ".join(map(str, r.head_dims)) if r.head_dims else f"multiples of {r.head_dim_multiple}"
            raise RecipeError(f"layout.head_dim_pad {requested} is not a head dim >= {head_dim} that "
                              f"{_where(r)} accepts ({allowed})",
                              hint="--set layout.head_dim_pad=0 picks the smallest accepted size")
        return requested
    if r.head_dims is None or head_dim in r.head_dims:
        return head_dim
    bigger = [d for d in r.head_dims if d >= head_dim]
    if not bigger:
        raise RecipeError(f"head_dim {head_dim} is larger than any {_where(r)} supports ({r.head_dims})",
                          hint="choose another backend with --set layout.backend")
    return bigger[0]
