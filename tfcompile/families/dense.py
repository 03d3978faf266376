"""The parameters of a plain dense decoder, from config.json alone (no transformers, no torch).

For the architectures below every parameter's name and shape follows from a few config.json
integers, so the checkpoint check (tfcompile/checkpoint_check.py) compares a checkpoint's
safetensors headers with this table instead of building the model through transformers'
modeling module (~3-6 s of imports). The table is the model's: tests/families/test_dense_spec.py
compares it with transformers' own meta model for each architecture and option.

`dense_spec(config)` is None whenever the config is not one of these, holds a key or value
outside `PLAIN_KEYS` (what transformers accepts without a word), or leaves a size to the
config class's default (a missing `num_key_value_heads`, Qwen3's `head_dim`): the caller then
builds the meta model, whose defaults are the authority.
"""

from __future__ import annotations

from dataclasses import dataclass

# architectures[0] -> (model_type, attention biases: "none" | "qkv" (always) | "flag" (attention_bias: q/k/v/o),
#                      has q_norm/k_norm, honours mlp_bias, head_dim must be given)
ARCHITECTURES = {
    "LlamaForCausalLM": ("llama", "flag", False, True, False),
    "MistralForCausalLM": ("mistral", "none", False, False, False),
    "Qwen2ForCausalLM": ("qwen2", "qkv", False, False, False),
    "Qwen3ForCausalLM": ("qwen3", "flag", True, False, True),
}
# the model types of the plain dense decoders above (rotations are fused only into these: tfcompile/rotate/fuse.py)
DENSE_MODEL_TYPES = tuple(dict.fromkeys(spec[0] for spec in ARCHITECTURES.values()))
# activations these architectures build (transformers' ACT2FN keys); another one goes to the meta model,
# which rejects a name it does not know
ACTIVATIONS = ("silu", "gelu", "gelu_pytorch_tanh", "gelu_new", "relu", "swish")
_SIZES = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
          "vocab_size")


def _num(v) -> bool:  # a finite number > 0, not a bool
    return type(v) in (int, float) and 0 < v < float("inf")


def _opt_id(v) -> bool:  # a token id, a list of them, or null
    return v is None or (type(v) is int and v >= 0) or (type(v) is list and all(type(x) is int and x >= 0 for x in v))


# Every other key config.json may hold on this path, with what transformers' config classes accept
# for it without a complaint. A key outside this table, or a value outside its rule (a rope_scaling
# dict included: transformers validates its contents), sends the config to the meta model, whose
# config class is the authority: this path must never accept what transformers would refuse (the
# fuzz of tests/safety/test_safety_fuzz.py holds it to that).
PLAIN_KEYS = {
    "architectures": lambda v: True, "model_type": lambda v: True, "hidden_act": lambda v: True,  # checked below
    "head_dim": lambda v: True, **{k: lambda v: True for k in _SIZES},
    "rms_norm_eps": _num, "rope_theta": _num, "initializer_range": _num,
    "max_position_embeddings": lambda v: type(v) is int and v > 0,
    "attention_dropout": lambda v: type(v) in (int, float) and 0 <= v < 1,
    "pretraining_tp": lambda v: type(v) is int and v > 0,
    **{k: lambda v: type(v) is bool for k in ("tie_word_embeddings", "attention_bias", "mlp_bias", "use_cache",
                                             "use_sliding_window")},
    **{k: _opt_id for k in ("bos_token_id", "eos_token_id", "pad_token_id")},
    **{k: lambda v: v is None or v in ("bfloat16", "float16", "float32") for k in ("torch_dtype", "dtype")},
    # the default RoPE only (transformers 5 writes {"rope_theta": T, "rope_type": "default"}); any other
    # rope type or key is validated by transformers, on the meta model's path
    **{k: lambda v: v is None or (type(v) is dict and v.get("rope_type") == "default"
                                  and set(v) <= {"rope_type", "rope_theta"} and _num(v.get("rope_theta", 1.0)))
       for k in ("rope_scaling", "rope_parameters")},
    # PretrainedConfig's own fields as it writes them
    **{k: lambda v: type(v) is bool for k in ("output_hidden_states", "output_attentions", "return_dict",
                                             "is_encoder_decoder")},
    "chunk_size_feed_forward": lambda v: type(v) is int and v >= 0,
    "problem_type": lambda v: v is None,
    **{k: lambda v: type(v) is dict and len(v) <= 2 ** 16 and all(type(a) is str and type(b) in (str, int)
                                                                   for a, b in v.items())
       for k in ("id2label", "label2id")},
    "sliding_window": lambda v: v is None or (type(v) is int and v > 0),
    "max_window_layers": lambda v: type(v) is int and v >= 0,
    "transformers_version": lambda v: type(v) is str, "_name_or_path": lambda v: type(v) is str,
}


def plain(config: dict) -> bool:
    """Every key of `config` is one PLAIN_KEYS knows, with a value it accepts."""
    return all(k in PLAIN_KEYS and PLAIN_KEYS[k](v) for k, v in config.items())


@dataclass(frozen=True)
class DenseSpec:
    required: dict[str, tuple[int, ...]]  # parameter name -> shape, every one must be in the checkpoint
    optional: dict[str, tuple[int, ...]]  # may be present: lm_head.weight when tied to the embeddings


def dense_spec(config: dict) -> DenseSpec | None:
    """The parameter table of `config` (a config.json dict), or None when it is not a plain dense decoder
    this module describes (the meta model decides then)."""
    arch = (config.get("architectures") or [None])[0] if type(config.get("architectures")) is list else None
    if arch not in ARCHITECTURES or len(config.get("architectures")) != 1 or not plain(config):
        return None
    model_type, bias, qk_norm, mlp_bias_flag, need_head_dim = ARCHITECTURES[arch]
    sizes = [config.get(k) for k in _SIZES]
    if config.get("model_type") != model_type or any(type(v) is not int or v <= 0 for v in sizes):
        return None
    hidden, inter, layers, heads, kv, vocab = sizes
    head_dim = config.get("head_dim")
    if head_dim is None and not need_head_dim and hidden % heads == 0:
        head_dim = hidden // heads
    flags = [config.get(k, False) for k in ("attention_bias", "mlp_bias", "tie_word_embeddings")]
    if type(head_dim) is not int or head_dim <= 0 or heads % kv or any(type(f) is not bool for f in flags) \
            or config.get("hidden_act", "silu") not in ACTIVATIONS:
        return None
    attention_bias, mlp_bias, tied = flags
    out: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (vocab, hidden), "model.norm.weight": (hidden,)}
    for i in range(layers):
        out.update(_layer(f"model.layers.{i}.", hidden, inter, heads * head_dim, kv * head_dim))
        p = f"model.layers.{i}."
        if bias == "qkv" or (bias == "flag" and attention_bias):
            out.update({f"{p}self_attn.q_proj.bias": (heads * head_dim,), f"{p}self_attn.k_proj.bias": (kv * head_dim,),
                        f"{p}self_attn.v_proj.bias": (kv * head_dim,)})
        if bias == "flag" and attention_bias:
            out[f"{p}self_attn.o_proj.bias"] = (hidden,)
        if qk_norm:
            out.update({f"{p}self_attn.q_norm.weight": (head_dim,), f"{p}self_attn.k_norm.weight": (head_dim,)})
        if mlp_bias_flag and mlp_bias:
            out.update({f"{p}mlp.gate_proj.bias": (inter,), f"{p}mlp.up_proj.bias": (inter,),
                        f"{p}mlp.down_proj.bias": (hidden,)})
    head = {"lm_head.weight": (vocab, hidden)}
    return DenseSpec(required=out, optional=head) if tied else DenseSpec(required={**out, **head}, optional={})


def _layer(p: str, hidden: int, inter: int, q_out: int, kv_out: int) -> dict[str, tuple[int, ...]]:
    """One decoder layer's weights: attention (q/k/v/o), gated MLP, the two RMSNorms. Shapes (out, in)."""
    return {f"{p}self_attn.q_proj.weight": (q_out, hidden), f"{p}self_attn.k_proj.weight": (kv_out, hidden),
            f"{p}self_attn.v_proj.weight": (kv_out, hidden), f"{p}self_attn.o_proj.weight": (hidden, q_out),
            f"{p}mlp.gate_proj.weight": (inter, hidden), f"{p}mlp.up_proj.weight": (inter, hidden),
            f"{p}mlp.down_proj.weight": (hidden, inter),
            f"{p}input_layernorm.weight": (hidden,), f"{p}post_attention_layernorm.weight": (hidden,)}


def matches(spec: DenseSpec, shapes: dict[str, tuple[int, ...]]) -> bool:
    """True when the checkpoint's {name: shape} is exactly the spec: every required parameter with its
    shape, optional ones only with theirs, nothing else. Anything else is for the meta model to name."""
    if any(shapes.get(n) != s for n, s in spec.required.items()):
        return False
    extra = set(shapes) - set(spec.required)
    return all(spec.optional.get(n) == shapes[n] for n in extra)
