"""Range checks on config.json values, before anything is built from them.

transformers trusts config.json: `num_hidden_layers: 1000000000` makes it
build a billion layers (verify grew to 11.5 GB before failing), a negative or
string size fails deep inside torch with an internal message. These checks
run when config.json is read (io/checkpoint.py `read_config`), for the top
level and every nested sub-config (`text_config`, `vision_config`, ...):

- size fields (layers, hidden, heads, experts, vocab, positions ...) must be
  integers (not bools, floats or strings) in a range no real model leaves (or
  lists of them, one per layer or stage),
  whatever the architecture calls them: a field the model type's transformers
  config class maps onto one of ours (its `attribute_map`: MPT's `n_layers`
  is `num_hidden_layers`, `d_model` is `hidden_size`) takes that field's range;
- any other integer that counts layers, blocks, heads or experts (a field name
  with `layers`, `blocks`, `heads` or `experts` as a word, and no `size` or
  `dim`) is at most the largest layer / head / expert count above;
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
    "head_dim": (0, 16 * _K), "kv_lora_rank": (1, 256 * _K), "q_lora_rank": (1, 256 * _K),
    "qk_rope_head_dim": (0, 16 * _K), "qk_nope_head_dim": (0, 16 * _K), "v_head_dim": (1, 16 * _K),
    "vocab_size": (1, 16 * _M), "type_vocab_size": (0, 16 * _M),
    "max_position_embeddings": (1, 1 << 30), "n_positions": (1, 1 << 30),
    "num_experts": (0, 64 * _K), "num_local_experts": (0, 64 * _K), "n_routed_experts": (0, 64 * _K),
    "num_experts_per_tok": (0, 64 * _K), "n_shared_experts": (0, 64 * _K), "first_k_dense_replace": (0, 4 * _K),
    "decoder_sparse_step": (1, 4 * _K), "num_nextn_predict_layers": (0, 4 * _K),
    "n_group": (1, 64 * _K), "topk_group": (1, 64 * _K), "sliding_window": (0, 1 << 30),
}
# field -> must the finite value be > 0?
# a count by the plural noun in its field name (the catch-all for spellings we do not know)
COUNT_WORDS = {"layers": INT_FIELDS["num_hidden_layers"][1], "blocks": INT_FIELDS["num_hidden_layers"][1],
               "heads": INT_FIELDS["num_attention_heads"][1], "experts": INT_FIELDS["num_experts"][1]}
FLOAT_FIELDS = {"rms_norm_eps": False, "layer_norm_eps": False, "layer_norm_epsilon": False, "rope_theta": True}
_NESTED_DEPTH = 4
# model types whose transformers config class has no attribute_map and no sub_configs: nothing to look up, so
# their config.json is checked without importing transformers (~3 s); tests/io compares this with transformers
PLAIN_MODEL_TYPES = frozenset({"llama", "mistral", "qwen2", "qwen3"})


def check_config_values(config: dict[str, Any], path: Path | str) -> None:
    """CheckpointError naming `path` and the key for the first value out of range."""
    _check(config, str(path), "", 0, None)


def _check(cfg: dict, path: str, prefix: str, depth: int, parent_cls: Any) -> None:
    cls = _config_class(cfg.get("model_type")) or parent_cls
    aliases = _aliases(cls)
    for key, value in cfg.items():
        where = f"{prefix}{key}"
        field = key if key in INT_FIELDS else aliases.get(key)
        if field is not None and value is not None:
            _check_size(path, where, value, field, "" if field == key else f" (this model's {field})")
        elif type(value) is int and value > _count_limit(str(key)):
            _fail(path, where, value, f"is out of range: a count of {str(key).split('_')[-1]} above "
                                      f"{_count_limit(str(key))} is no real model")
        elif key in FLOAT_FIELDS and value is not None:
            ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
            if not ok or value < 0 or (FLOAT_FIELDS[key] and value == 0):
                _fail(path, where, value, "must be a finite " + ("positive" if FLOAT_FIELDS[key] else
                                                                  "non-negative") + " number")
        elif isinstance(value, dict) and depth < _NESTED_DEPTH:
            _check(value, path, f"{where}.", depth + 1, _sub_class(cls, key))
    heads, kv = cfg.get("num_attention_heads"), cfg.get("num_key_value_heads")
    if type(heads) is int and type(kv) is int and heads % kv:
        _fail(path, f"{prefix}num_key_value_heads", kv,
              f"must divide num_attention_heads ({heads}): each KV head serves a whole group of query heads")


def _check_size(path: str, where: str, value: Any, field: str, named: str) -> None:
    """An integer in INT_FIELDS[field]'s range; or a list (or map) of them, one per layer or stage
    (Gemma 3n's per-layer intermediate_size, Swin's per-stage num_heads)."""
    lo, hi = INT_FIELDS[field]
    items = value if isinstance(value, list) and value else \
        list(value.values()) if isinstance(value, dict) and value else [value]
    for item in items:
        if type(item) is not int:
            _fail(path, where, value, f"must be an integer from {lo} to {hi}{named}")
        if not lo <= item <= hi:
            _fail(path, where, value, f"is out of range{named}: expected {lo} to {hi}")


def _config_class(model_type: Any) -> Any:
    """transformers' config class for `model_type`, or None (unknown, or no transformers)."""
    if not isinstance(model_type, str) or model_type in PLAIN_MODEL_TYPES:
        return None
    try:
        # lazy: transformers (~2 s to import); every command that reads a config.json builds its model
        from transformers import CONFIG_MAPPING

        return CONFIG_MAPPING[model_type] if model_type in CONFIG_MAPPING else None
    except Exception:  # noqa: BLE001 - no transformers, or a broken entry: the literal names still apply
        return None


def _sub_class(cls: Any, key: str) -> Any:
    """The config class of sub-config `key` (Qwen2.5-VL's vision_config), when `cls` declares it."""
    sub = (getattr(cls, "sub_configs", None) or {}).get(key) if cls is not None else None
    return sub if isinstance(sub, type) else None


def _aliases(cls: Any) -> dict[str, str]:
    """{field as this config class spells it: our INT_FIELDS name}, from its `attribute_map`."""
    amap = getattr(cls, "attribute_map", None) if cls is not None else None
    if not isinstance(amap, dict):
        return {}
    return {spelled: ours for ours, spelled in amap.items()
            if ours in INT_FIELDS and isinstance(spelled, str) and spelled not in INT_FIELDS}


def _count_limit(key: str) -> float:
    words = key.lower().split("_")
    if "size" in words or "dim" in words:
        return math.inf
    return min((COUNT_WORDS[w] for w in words if w in COUNT_WORDS), default=math.inf)


def _fail(path: str, key: str, value: Any, why: str) -> None:
    shown = repr(value)
    shown = shown if len(shown) <= 40 else shown[:37] + "..."
    raise CheckpointError(f"{path}: {key} = {shown} {why}",
                          hint="config.json does not describe a real model; fix the value or re-download the "
                               "checkpoint")
