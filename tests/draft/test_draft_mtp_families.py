"""`--draft mtp` beyond DeepSeek-V3: DeepSeek-V3.2 / GLM-5 (DSA indexer in the MTP decoder layer) and
Qwen3.5 (`mtp.` layout), on tiny models built in code (tests/fixtures/families.py).

- the MTP forward against an independent computation from the raw safetensors tensors: F.rms_norm
  (Qwen3.5: scale 1 + weight), matmuls, the decoder layer as transformers builds it (DSA: the
  `num_hidden_layers + 1` model from_pretrained loads from the same file; Qwen3.5: the class with
  the `mtp.layers.0.` tensors), run over the whole sequence without a cache, step 0 and a chained
  step, recycling what vLLM 0.32 recycles (deepseek_mtp.py: shared_head.norm of the output;
  qwen3_5_mtp.py: the normed output); the DSA indexer's top-8 selects among 20 keys here;
- exactness: speculative decoding with the MTP drafter emits the target's greedy decoding, on the
  checkpoint and on fp8 / nvfp4 artifacts as `tfcompile eval` serves them;
- acceptance on the artifact against the source: an oracle MTP layer (the target shifted one
  position) keeps most of its acceptance when target and MTP layer are quantized alike.
"""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

from tfcompile.draft.spec import Stats, Target, greedy, speculative

N_NEW = 24


def _prompts(n: int, length: int, seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, 200, (n, length), generator=g).tolist()


def _target(path):
    from tfcompile.evaluate.models import load_candidate

    return load_candidate(path, torch.float32).model.eval()


@pytest.fixture(scope="module")
def random_mtp(family_factory, tmp_path_factory):
    """{family: checkpoint with a random MTP layer}, built on first use."""
    made = {}

    def get(family):
        if family not in made:
            out = tmp_path_factory.mktemp("mtpfam") / family
            if family == "qwen3_5":
                made[family] = family_factory.add_qwen3_5_mtp(family_factory.make_tiny_qwen3_5(out, layers=4))
            else:
                build = family_factory.FAMILIES[family].build
                made[family] = family_factory.add_mtp_layer(build(out, layers=2, dense=1))
        return made[family]
    return get


def _block(src, cfg: dict, raw: dict, qwen: bool):
    """The MTP decoder layer as transformers builds it, with its tensors, and the rotary embedding."""
    from transformers import AutoModelForCausalLM

    n = cfg["num_hidden_layers"]
    if qwen:
        from transformers import Qwen3_5TextConfig
        from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5DecoderLayer, Qwen3_5TextRotaryEmbedding

        c = Qwen3_5TextConfig(**{**cfg, "layer_types": cfg["layer_types"] + ["full_attention"],
                                 "num_hidden_layers": n + 1})
        block = Qwen3_5DecoderLayer(c, n)
        block.load_state_dict({k[len("mtp.layers.0."):]: v for k, v in raw.items() if k.startswith("mtp.layers.0.")},
                              strict=True)
        return block.eval(), Qwen3_5TextRotaryEmbedding(c)
    extra = {"mlp_layer_types": cfg["mlp_layer_types"] + ["sparse"]}
    if "indexer_types" in cfg:
        extra["indexer_types"] = cfg["indexer_types"] + ["full"]
    wide = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32, num_hidden_layers=n + 1, **extra).eval()
    return wide.model.layers[n], wide.model.rotary_emb


def _by_hand(src, seq: list[int]):
    """Step-0 logits [n-1, V] over seq and the chained step's logits [V] after the last argmax."""
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    cfg = json.loads((src / "config.json").read_text())
    qwen = "mtp_num_hidden_layers" in cfg
    n, eps, hid = cfg["num_hidden_layers"], cfg["rms_norm_eps"], cfg["hidden_size"]
    raw = {k: v.float() for k, v in load_file(str(src / "model.safetensors")).items()}
    pre = "mtp." if qwen else f"model.layers.{n}."
    w = {k[len(pre):]: v for k, v in raw.items() if k.startswith(pre)}
    block, rotary = _block(src, cfg, raw, qwen)
    target = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32).eval()
    x = torch.tensor(seq)

    def rms(h, name):  # Qwen3.5's RMSNorm scales by 1 + weight
        return F.rms_norm(h, (hid,), w[name] + (1.0 if qwen else 0.0), eps)

    def fuse(tokens, hidden, zero_first):
        e = raw["model.embed_tokens.weight"][tokens].clone()  # the target's: vLLM's EagleProposer shares it
        if qwen:
            return torch.cat([rms(e, "pre_fc_norm_embedding.weight"), rms(hidden, "pre_fc_norm_hidden.weight")],
                             -1) @ w["fc.weight"].T
        if zero_first:
            e[0] = 0.0  # deepseek_mtp.py: position 0 masked
        return torch.cat([rms(e, "enorm.weight"), rms(hidden, "hnorm.weight")], -1) @ w["eh_proj.weight"].T

    def run(z):  # the decoder layer over positions 0..T-1, causal, no cache
        t = z.shape[0]
        mask = torch.full((t, t), float("-inf")).triu(1)[None, None]
        pos = torch.arange(t)[None]
        out = block(z[None], attention_mask=mask, position_ids=pos, position_embeddings=rotary(z[None], pos))
        out = (out[0] if isinstance(out, tuple) else out)[0]
        return rms(out, "norm.weight") if qwen else out

    def head(h):
        if qwen:
            return h @ raw["lm_head.weight"].T
        return rms(h, "shared_head.norm.weight") @ w["shared_head.head.weight"].T

    def recycle(h):
        return h if qwen else rms(h, "shared_head.norm.weight")

    with torch.no_grad():
        g = target(input_ids=x[None, :-1], output_hidden_states=True).hidden_states[-1][0]  # [n-1, H], final norm
        z = fuse(x[1:], g, True)  # index i: token x[i+1], hidden g[i], position i
        out = run(z)
        step0 = head(out)
        d1 = step0[-1].argmax()
        z2 = fuse(d1[None], recycle(out[-1:]), False)  # chained: the draft at the next position
        chain = head(run(torch.cat([z, z2]))[-1])
    return step0, chain


@pytest.mark.parametrize("family", ["deepseek_v32", "glm_moe_dsa", "qwen3_5"])
def test_mtp_forward_matches_an_independent_computation(family, random_mtp, mtp_matches_by_hand):
    src = random_mtp(family)
    seq = _prompts(1, 20, seed=3)[0]
    step0, chain = _by_hand(src, seq)
    mtp_matches_by_hand(src, _target(src), seq, step0, chain)


@pytest.fixture(scope="module")
def oracles(family_factory, tmp_path_factory):
    """{(family, format): checkpoint or artifact}: oracle MTP layers (the target shifted one position)."""
    made = {}

    def get(family, fmt="bf16"):
        if (family, "bf16") not in made:
            out = tmp_path_factory.mktemp("mtporacle") / family
            made[family, "bf16"] = (family_factory.make_qwen3_5_mtp_oracle(out) if family == "qwen3_5"
                                    else family_factory.make_dsa_mtp_oracle(out, glm=family == "glm_moe_dsa"))
        if (family, fmt) not in made:
            made[family, fmt] = quantized(made[family, "bf16"], made[family, "bf16"].parent / fmt, fmt)
        return made[family, fmt]
    return get


def quantized(src, out, fmt: str):
    """`tfcompile quantize SRC -o OUT --format FMT` in-process (random calibration for nvfp4)."""
    from tfcompile.cli.main import main

    calib = ["--calib", "random", "--calib-samples", "2", "--calib-seq-len", "32"] if fmt == "nvfp4" else []
    assert main(["quantize", str(src), "-o", str(out), "--format", fmt, "-q", *calib]) == 0
    return out


def _acceptance(model, layer, prompts, k, refs):
    from tfcompile.draft.mtp import TARGET_HIDDEN, MTPDrafter

    total, target = Stats(k), Target(model, TARGET_HIDDEN)
    for i, p in enumerate(prompts):
        out, st = speculative(target, MTPDrafter(layer), p, N_NEW, k)
        assert out == refs[i], f"prompt {i}, k={k}: speculative output is not the greedy one"
        total.add(st)
    return total


@pytest.mark.parametrize("family", ["deepseek_v32", "qwen3_5"])
@pytest.mark.parametrize("fmt", ["fp8-dynamic", "nvfp4"])
def test_quantized_mtp_is_exact_and_keeps_the_sources_acceptance(family, fmt, oracles):
    """The artifact's MTP layer against the artifact as served, beside the source's MTP layer against
    the source: exact on both, accepted well above a learnt-nothing head (1.0), within a margin of the
    source (the quantized target decodes other tokens: the drop mixes both effects, docs/accuracy.md)."""
    from tfcompile.draft.mtp_load import load_mtp

    prompts = _prompts(3, 16, seed=5)
    figures = {}
    for which in ("bf16", fmt):
        path = oracles(family, which)
        model = _target(path)
        layer = load_mtp(path, model)
        if which != "bf16":
            assert any(h for mod in layer.block.modules() for h in mod._forward_pre_hooks.values()), \
                "the artifact's MTP activations are not quantized"
        refs = [greedy(Target(model), p, N_NEW) for p in prompts]
        figures[which] = _acceptance(model, layer, prompts, 2, refs)
    src, art = figures["bf16"].acceptance_length, figures[fmt].acceptance_length
    assert src > 1.6 and art > 1.4 and art >= src - 0.5, (figures["bf16"].per_position(), figures[fmt].per_position())
