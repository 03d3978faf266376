"""Multi-token-prediction (MTP) layers: where checkpoints keep them, from config.json alone.

transformers builds no module for them (its models list them in `_keys_to_ignore_on_load_unexpected`),
but engines load them as the speculative draft (vLLM `--speculative-config '{"method": "mtp"}'`), so
tfcompile never drops them: checkpoint_check accepts their tensors, select quantizes their decoder
block like any other layer and keeps the projections vLLM builds unquantized (rules.MTP, MTP_FC).

Layouts (the published checkpoints; vLLM's loaders read exactly these names):
- DeepSeek-V3/V3.2, GLM-4.5/4.6, GLM-5: `model.layers.{num_hidden_layers + i}.` for
  i < num_nextn_predict_layers, holding enorm, hnorm [H], eh_proj [H, 2H], shared_head.norm [H],
  shared_head.head [V, H], embed_tokens [V, H] (DeepSeek) and a full decoder layer (vLLM
  deepseek_mtp.py `DeepSeekMultiTokenPredictorLayer`, glm4_moe_mtp.py `Glm4MoeMultiTokenPredictorLayer`);
- Qwen3.5 / Qwen3-Next: `mtp.` (fc [H, 2H], pre_fc_norm_embedding, pre_fc_norm_hidden, norm,
  layers.{i} for i < mtp_num_hidden_layers; vLLM qwen3_5_mtp.py `Qwen3_5MultiTokenPredictor`).
"""

from __future__ import annotations

from typing import Any, Mapping


def mtp_prefixes(config: Mapping[str, Any]) -> tuple[str, ...]:
    """Tensor-name prefixes of the MTP layers config.json declares (none if it declares none)."""
    text = config.get("text_config") if isinstance(config.get("text_config"), Mapping) else config
    n = int(text.get("num_hidden_layers") or 0)
    k = int(text.get("num_nextn_predict_layers") or 0)
    out = [f"model.layers.{i}." for i in range(n, n + k)]
    if int(text.get("mtp_num_hidden_layers") or 0):
        out.append("mtp.")
    return tuple(out)


def is_mtp(name: str, prefixes: tuple[str, ...]) -> bool:
    return name.startswith(prefixes) if prefixes else False
