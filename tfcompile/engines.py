"""The serving engines tfcompile writes for: one declaration each, with its sources.

An `Engine` holds what tfcompile knows of one engine: the attention backends it reads KV caches
with (`BackendRules`: layouts, page sizes, head dims, KV dtypes, KV-scale granularity, RoPE,
whether its checkpoints carry fused weights; tfcompile/layout/engines.py validates a layout
against them), and its quirks with quantized checkpoints that `verify --engine` checks
(tfcompile/artifact/engines.py). A new engine is one `Engine` here; its readers take it
unedited (tests/test_toy_engine.py).

Facts are as read in the sources named per row (vLLM 0.11-0.32 model, quantization and attention
code, FlashInfer, TensorRT-LLM and SGLang docs and PRs; docs/formats.md "Engine layouts"). Where a
source was not checked on a run, the row says so; a rule that is unknown is None (not checked)
rather than guessed.
"""

from __future__ import annotations

from dataclasses import dataclass


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


@dataclass(frozen=True)
class Engine:
    name: str
    backends: tuple[BackendRules, ...]  # its attention backends; the first is the default
    # refuses fp8-block Linears whose tensor-parallel partitions are not whole 128-blocks
    # (vLLM fp8_utils.validate_fp8_block_shape; SGLang inherits the check)
    fp8_block_partitions: bool
    # builds the families' engine_unquantized modules without a quantization config (vLLM's model
    # code, read: deepseek_v2.py Indexer, deepseek_mtp.py), so it cannot load them quantized
    builds_unquantized: bool
    # reads a weight-only MXFP4 checkpoint as W4A4 where a W4A4 kernel exists (vLLM 0.32, #56770)
    mxfp4a16_as_w4a4: bool
    checked_by_default: bool  # quantize checks it (and warns) when no --engine is named
    # applies compressed-tensors' online transforms (transform_config) to Linear inputs, on one GPU only (vLLM:
    # compressed_tensors/transform/linear.py, module.py "Online transforms with tensor parallelism is not supported")
    online_transforms: bool = False

    @property
    def kv_dtypes(self) -> frozenset[str]:
        """KV-cache dtypes some backend of it serves."""
        return frozenset(d for b in self.backends for d in b.kv_dtypes)


ENGINES: dict[str, Engine] = {e.name: e for e in (
    Engine("vllm", (
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
    ), fp8_block_partitions=True, builds_unquantized=True, mxfp4a16_as_w4a4=True, checked_by_default=True,
       online_transforms=True),
    Engine("sglang", (
        BackendRules(
            "sglang", "flashinfer", ("NHD",), "any", 1, (64, 128, 256), 8,
            ("bf16", "fp16", "fp8_e4m3"), "no", ("half",), False,
            "sglang MHATokenToKVPool: k_buffer[layer] = [size, head_num, head_dim] (NHD), page_size 1 by "
            "default; one k_scale/v_scale per layer (per-head scales were proposed in sglang PR #26436, "
            "closed unmerged)"),
    ), fp8_block_partitions=True, builds_unquantized=False, mxfp4a16_as_w4a4=False, checked_by_default=True),
    Engine("trtllm", (
        BackendRules(
            "trtllm", "trtllm", ("HND",), "pow2", 32, None, 8,
            ("bf16", "fp16", "fp8_e4m3", "nvfp4"), "no", ("half", "interleaved"), True,
            "TensorRT-LLM docs (features/kv-cache): tokens per block 'must be power of 2', KV dtypes FP16, "
            "BF16, FP8, INT8, NVFP4 (Blackwell); paged block [2, num_kv_heads, tokens_per_block, head_size]; "
            "one kv_cache_scaling_factor per layer; rope_gpt_neox (half) and rope_gptj (interleaved) "
            "position embeddings; its checkpoints carry fused qkv / gate-up weights"),
    ), fp8_block_partitions=False, builds_unquantized=False, mxfp4a16_as_w4a4=False, checked_by_default=False),
)}
