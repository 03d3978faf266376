"""Range checks on config.json values, before anything is built from them.

transformers trusts config.json: `num_hidden_layers: 1000000000` makes it
build a billion layers (verify grew to 11.5 GB before failing), a negative or
string size fails deep inside torch with an internal message. These checks
run when config.json is read (io/checkpoint.py `read_config`), for the top
level and every nested sub-config (`text_config`, `vision_config`, ...):

- size fields (layers, hidden, heads, experts, vocab, positions ...) must be
  integers (not bools, floats or strings) in a range no real model leaves;
- a few float fields (epsilons, RoPE theta) must be finite numbers;
- `num_attention_heads` must be a multiple of `num_key_value_heads`.

`null` passes (transformers then uses its default or disables the feature).
Bounds are generous on purpose: the largest open models are far inside them.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from tfcompile.errors import CheckpointError

_K, _M = 1 << 10, 1 << 20
# field -> (smallest, largest) allowed integer
INT_FIELDS: dict[str, tuple[int, int]] = {
    "num_hidden_layers": (1, 4 * _K), "n_layer": (1, 4 * _K), "num_layers": (1, 4 * _K),
    "hidden_size": (1, 256 * _K), "n_embd": (1, 256 * _K), "d_model": (1, 256 * _K),
    "intermediate_size": (1, 4 * _M), "moe_intermediate_size": (1, 4 * _M), "ffn_dim": (1, 4 * _M),
    "shared_expert_intermediate_size": (0, 4 * _M), "n_inner": (1, 4 * _M),
    "num_attention_heads": (1, 16 * _K), "n_head": (1, 16 * _K), "num_key_value_heads": (1, 16 * _K),
    "head_dim": (1, 16 * _K), "kv_lora_rank": (1, 256 * _K), "q_lora_rank": (1, 256 * _K),
    "qk_rope_head_dim": (0, 16 * _K), "qk_nope_head_dim": (0, 16 * _K), "v_head_dim": (1, 16 * _K),
    "vocab_size": (1, 16 * _M), "type_vocab_size": (0, 16 * _M),
    "max_position_embeddings": (1, 1 << 30), "n_positions": (1, 1 << 30),
    "num_experts": (0, 64 * _K), "num_local_experts": (0, 64 * _K), "n_routed_experts": (0, 64 * _K),
    "num_experts_per_tok": (0, 64 * _K), "n_shared_experts": (0, 64 * _K), "first_k_dense_replace": (0, 4 * _K),
    "decoder_sparse_step": (1, 4 * _K), "num_nextn_predict_layers": (0, 4 * _K),
    "n_group": (1, 64 * _K), "topk_group": (1, 64 * _K), "sliding_window": (1, 1 << 30),
}
# field -> must the finite value be > 0?
FLOAT_FIELDS = {"rms_norm_eps": False, "layer_norm_eps": False, "layer_norm_epsilon": False, "rope_theta": True}
_NESTED_DEPTH = 4


def check_config_values(config: dict[str, Any], path: Path | str) -> None:
    """CheckpointError naming `path` and the key for the first value out of range."""
    _check(config, str(path), "", 0)


def _check(cfg: dict, path: str, prefix: str, depth: int) -> None:
    for key, value in cfg.items():
        where = f"{prefix}{key}"
        if key in INT_FIELDS and value is not None:
            lo, hi = INT_FIELDS[key]
            if type(value) is not int:
                _fail(path, where, value, f"must be an integer from {lo} to {hi}")
            if not lo <= value <= hi:
                _fail(path, where, value, f"is out of range: expected {lo} to {hi}")
        elif key in FLOAT_FIELDS and value is not None:
            ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
            if not ok or value < 0 or (FLOAT_FIELDS[key] and value == 0):
                _fail(path, where, value, "must be a finite " + ("positive" if FLOAT_FIELDS[key] else
                                                                  "non-negative") + " number")
        elif isinstance(value, dict) and depth < _NESTED_DEPTH:
            _check(value, path, f"{where}.", depth + 1)
    heads, kv = cfg.get("num_attention_heads"), cfg.get("num_key_value_heads")
    if type(heads) is int and type(kv) is int and heads % kv:
        _fail(path, f"{prefix}num_key_value_heads", kv,
              f"must divide num_attention_heads ({heads}): each KV head serves a whole group of query heads")


def _fail(path: str, key: str, value: Any, why: str) -> None:
    shown = repr(value)
    shown = shown if len(shown) <= 40 else shown[:37] + "..."
    raise CheckpointError(f"{path}: {key} = {shown} {why}",
                          hint="config.json does not describe a real model; fix the value or re-download the "
                               "checkpoint")
