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

import pytest
import torch
from mtp_oracle import ByHand

from tfcompile.draft.spec import Stats, Target, greedy, speculative

N_NEW = 24


def _prompts(n: int, length: int, seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, 200, (n, length), generator=g).tolist()


def _target(path):
    from tfcompile.evaluate.models import load_candidate

    return load_candidate(path, torch.float32).model.eval()


def _by_hand(src, seq: list[int]):
    """Step-0 logits [n-1, V] over seq and the chained step's logits [V] after the last argmax."""
    from transformers import AutoModelForCausalLM

    m = ByHand(src)
    target = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32).eval()
    x = torch.tensor(seq)

    def head(h):
        if m.qwen:
            return h @ m.raw["lm_head.weight"].T
        return m.rms(h, "shared_head.norm.weight") @ m.w["shared_head.head.weight"].T

    def recycle(h):
        return h if m.qwen else m.rms(h, "shared_head.norm.weight")

    with torch.no_grad():
        g = target(input_ids=x[None, :-1], output_hidden_states=True).hidden_states[-1][0]  # [n-1, H], final norm
        z = m.fuse(x[1:], g, True)  # index i: token x[i+1], hidden g[i], position i
        out = m.run(z)
        step0 = head(out)
        d1 = step0[-1].argmax()
        z2 = m.fuse(d1[None], recycle(out[-1:]), False)  # chained: the draft at the next position
        chain = head(m.run(torch.cat([z, z2]))[-1])
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

    # 16 x 32 random tokens: W4A4 RTN chooses each group's scales by its output error on them, the target's
    # and the MTP layer's each on its own inputs (tfcompile/draft/mtp_calibrate.py); on 2 x 32 the two
    # copies of the oracle's layer got visibly different choices (docs/accuracy.md "MTP layers calibrated")
    calib = ["--calib", "random", "--calib-samples", "16", "--calib-seq-len", "32"] if fmt == "nvfp4" else []
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
