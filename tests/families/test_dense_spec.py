"""tfcompile/families/dense.py: the parameter table from config.json equals transformers' own model.

The oracle is transformers: the architecture built on the meta device, its state_dict (parameters
and persistent buffers) and its tied keys. A table that drifts from it (a bias, a norm, a default)
fails here, so the checkpoint check's fast path cannot accept what the model does not have.
"""

from __future__ import annotations

import pytest
import torch
import transformers

from tfcompile.families.dense import ARCHITECTURES, dense_spec, matches
from tfcompile.io.config_check import PLAIN_MODEL_TYPES

BASE = {"hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "vocab_size": 128}
VARIANTS = [{}, {"num_key_value_heads": 4}, {"head_dim": 32}, {"tie_word_embeddings": True},
            {"attention_bias": True}, {"mlp_bias": True}, {"attention_bias": True, "tie_word_embeddings": True}]


def _config(arch: str, extra: dict) -> dict:
    cfg = {"architectures": [arch], "model_type": ARCHITECTURES[arch][0], **BASE, **extra}
    if ARCHITECTURES[arch][4]:
        cfg.setdefault("head_dim", 16)
    return cfg


def _transformers_table(cfg: dict) -> tuple[dict, set]:
    cls = getattr(transformers, cfg["architectures"][0])
    with torch.device("meta"):
        model = cls(cls.config_class.from_dict(cfg))
    tied = set((getattr(model, "all_tied_weights_keys", None) or {}))
    return {n: tuple(t.shape) for n, t in model.state_dict().items()}, tied


@pytest.mark.parametrize("extra", VARIANTS, ids=lambda e: ",".join(e) or "base")
@pytest.mark.parametrize("arch", sorted(ARCHITECTURES))
def test_table_is_the_models(arch, extra):
    cfg = _config(arch, extra)
    spec = dense_spec(cfg)
    assert spec is not None
    want, tied = _transformers_table(cfg)
    assert {**spec.required, **spec.optional} == want
    assert set(spec.optional) == tied  # only a tied lm_head may be left out


@pytest.mark.parametrize("arch", sorted(ARCHITECTURES))
def test_defaults_left_to_transformers(arch):
    """A size the config class would default is not guessed: the meta model decides."""
    cfg = _config(arch, {})
    del cfg["num_key_value_heads"]
    assert dense_spec(cfg) is None
    assert dense_spec({**_config(arch, {}), "hidden_act": "no-such-activation"}) is None
    assert dense_spec({**_config(arch, {}), "model_type": "other"}) is None


def test_other_architectures_are_not_described():
    assert dense_spec({**BASE, "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe"}) is None
    assert dense_spec({**BASE, "architectures": ["LlamaForCausalLM"], "model_type": "llama",
                       "hidden_size": True}) is None


def test_matches_exactly():
    spec = dense_spec(_config("LlamaForCausalLM", {"tie_word_embeddings": True}))
    shapes = dict(spec.required)
    assert matches(spec, shapes)
    assert matches(spec, {**shapes, "lm_head.weight": (128, 64)})  # tied head present: fine
    assert not matches(spec, {**shapes, "lm_head.weight": (64, 64)})
    assert not matches(spec, {**shapes, "model.layers.0.self_attn.rotary_emb.inv_freq": (8,)})
    shapes.pop("model.norm.weight")
    assert not matches(spec, shapes)


@pytest.mark.parametrize("model_type", sorted(PLAIN_MODEL_TYPES))
def test_plain_model_types_have_nothing_to_look_up(model_type):
    """config_check skips transformers for these: their config classes map no field names."""
    cls = transformers.CONFIG_MAPPING[model_type]
    assert not cls.attribute_map
    assert not getattr(cls, "sub_configs", None)
