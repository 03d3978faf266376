"""What each target engine's attention backend accepts: one table, with sources.

`RULES["engine/backend"]` holds the KV-cache layouts, page (block) sizes,
head dims, KV dtypes and KV-scale granularity a backend reads, the RoPE
convention its model code applies to a Hugging Face Llama-family checkpoint,
and whether the engine's view should carry fused q/k/v and gate/up weights.
`check(...)` validates a requested combination against it and raises
RecipeError (exit 1) with a hint naming what the backend does accept.

Facts are as read in the sources named per row (vLLM 0.11-0.17 attention
backends, FlashInfer, TensorRT-LLM and SGLang docs and PRs; docs/formats.md "Engine layouts").
Where a source was not checked on a run, the row says so; a rule that is
unknown is None (not checked) rather than guessed.
"""

from __future__ import annotations

from dataclasses import dataclass

from tfcompile.errors import RecipeError
from tfcompile.schemes import KV_BY_DTYPE

KV_LAYOUTS = ("NHD", "HND")  # per page: [block_size, kv_heads, head_dim] vs [kv_heads, block_size, head_dim]
KV_DTYPES = ("bf16", "fp16", "fp8_e4m3", "nvfp4")
ROPE_KNOWN = ("half", "interleaved")  # RoPE conventions (tfcompile/layout/heads.py)


@dataclass(frozen=True)
class BackendRules:
    engine: str
    backend: str
    kv_layouts: tuple[str, ...]  # accepted; the first is the backend's own
    block_sizes: str  # "multiple:16" | "pow2" | "one_of:16,32,64" | "any"
    default_block: int
    head_dims: tuple[int, ...] | None  # accepted head dims (pad up to one); None = not checked
    head_dim_multiple: int  # head_dim % this == 0 (8: FlashAttention's vector width)
    kv_dtypes: tuple[str, ...]
    per_head_scales: str  # "yes" | "collapse" (engine reads max over heads) | "no"
    rope: tuple[str, ...]  # conventions its model code can apply to a Llama-family view
    fuse: bool  # the view carries fused qkv_proj / gate_up_proj (False: the engine fuses on load)
    source: str


RULES: dict[tuple[str, str], BackendRules] = {r.engine + "/" + r.backend: r for r in (
    BackendRules(
        "vllm", "flash-attn", ("NHD",), "multiple:16", 16, None, 8,
        ("bf16", "fp16", "fp8_e4m3"), "yes", ("half",), False,
        "vllm/v1/attention/backends/flash_attn.py: get_kv_cache_shape -> (2, num_blocks, block_size, "
        "num_kv_heads, head_size), 'Block size must be a multiple of 16'; head sizes % 8 == 0 up to 256; "
        "per-head KV scales: vLLM PR #34281 (v0.17); Llama model code applies neox (half-split) RoPE"),
    BackendRules(
        "vllm", "flashinfer", ("HND", "NHD"), "one_of:16,32,64", 16, (64, 128, 256), 8,
        ("bf16", "fp16", "fp8_e4m3"), "collapse", ("half",), False,
        "vllm/v1/attention/backends/flashinfer.py: get_supported_kernel_block_sizes [16, 32, 64], HND "
        "stride order; FlashInfer head dims 64/128/256; one k_scale/v_scale per layer, so per-head "
        # this text is the row's `rules_source` in kv_cache.json (artifact bytes): kept as written; the
        # fact is in docs/formats.md "Engine layouts"
        "scales collapse to their max (REFERENCE.md §6)"),
    BackendRules(
        "sglang", "flashinfer", ("NHD",), "any", 1, (64, 128, 256), 8,
        ("bf16", "fp16", "fp8_e4m3"), "no", ("half",), False,
        "sglang MHATokenToKVPool: k_buffer[layer] = [size, head_num, head_dim] (NHD), page_size 1 by "
        "default; one k_scale/v_scale per layer (per-head scales were proposed in sglang PR #26436, "
        "closed unmerged)"),
    BackendRules(
        "trtllm", "trtllm", ("HND",), "pow2", 32, None, 8,
        ("bf16", "fp16", "fp8_e4m3", "nvfp4"), "no", ("half", "interleaved"), True,
        "TensorRT-LLM docs (features/kv-cache): tokens per block 'must be power of 2', KV dtypes FP16, "
        "BF16, FP8, INT8, NVFP4 (Blackwell); paged block [2, num_kv_heads, tokens_per_block, head_size]; "
        "one kv_cache_scaling_factor per layer; rope_gpt_neox (half) and rope_gptj (interleaved) "
        "position embeddings; its checkpoints carry fused qkv / gate-up weights"),
)}
ENGINES = tuple(sorted({k.split("/")[0] for k in RULES}))
DEFAULT_BACKEND = {"vllm": "flash-attn", "sglang": "flashinfer", "trtllm": "trtllm"}


def rules_for(engine: str, backend: str = "") -> BackendRules:
    if engine not in DEFAULT_BACKEND:
        raise RecipeError(f"layout.target {engine!r} is not a known engine",
                          hint="--layout " + "|".join(ENGINES))
    key = f"{engine}/{backend or DEFAULT_BACKEND[engine]}"
    if key not in RULES:
        known = ", ".join(k.split("/")[1] for k in RULES if k.startswith(engine + "/"))
        raise RecipeError(f"layout.backend {backend!r} is not a {engine} attention backend tfcompile knows",
                          hint=f"--set layout.backend=<{known}>")
    return RULES[key]


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
        others = [f"{k.split('/')[0]} ({k.split('/')[1]})" for k, x in RULES.items() if dtype in x.kv_dtypes]
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
                               + "(" + ", ".join(sorted({x.engine for x in RULES.values() if rope in x.rope})) + ")")


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
