"""vLLM CPU generates from tfcompile's fp8-dynamic artifacts what transformers + compressed-tensors
generate from the same artifact: greedy tokens equal, or the first divergence explained by a
near-tie (both engines' margin between the two tokens below the rounding noise measured on the
steps before it). Families whose experts vLLM's CPU build cannot run (no FP8 fused-MoE backend:
test_vllm_oracle.py; DeepSeek-V3.2 / GLM-5: no sparse attention on CPU) are not generated; the
dense families whose attention it cannot run at their tiny size (head_dim 16: "Unsupported CPU
attention configuration") are generated here at a head_dim the CPU attention takes (64): Llama,
Qwen3 and Qwen3.5 (Gated DeltaNet : gated attention, linear_attn kept in bf16).

Slow job: one vLLM process loads the tiny artifacts and SmolLM2-135M (~3-4 min here).
"""

from __future__ import annotations

import json
import math

import pytest
import torch

from engine_util import run_driver
from families_util import load_fixture, quantize

pytestmark = pytest.mark.slow

STEPS = 16
DENSE = ("llama", "qwen3", "qwen3_5")  # qwen3_5: the 2026 family whose layers vLLM's CPU build runs
TOL_FLOOR = 0.05  # nats: the noise assumed when no step agreed (two bf16 engines never agree closer)


def _dense(name: str, out):
    """Tiny dense models of the families vLLM's CPU build runs, head_dim 64 (its attention's minimum
    tested here), logits peaked enough (init std 0.08) that greedy is mostly not a tie."""
    import transformers

    families = load_fixture("families")
    common = dict(families._COMMON, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=64)
    if name == "qwen3_5":  # Gated DeltaNet : gated attention 3:1 (linear_attn kept), 4 layers, heads of 64
        common.update(num_hidden_layers=4, linear_num_value_heads=4, linear_num_key_heads=2, linear_key_head_dim=64,
                      linear_value_head_dim=64)
    cfg = {"llama": transformers.LlamaConfig, "qwen3": transformers.Qwen3Config,
           "qwen3_5": transformers.Qwen3_5TextConfig}[name](**common)
    arch = {"llama": "LlamaForCausalLM", "qwen3": "Qwen3ForCausalLM", "qwen3_5": "Qwen3_5ForCausalLM"}[name]
    return families._build(arch, cfg, out, torch.bfloat16, 0)


def _prompts(tokenizer_dir) -> list[list[int]]:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    texts = ("The capital of France is", "def fibonacci(n):")
    return [tok(t)["input_ids"] for t in texts]


def _transformers_greedy(artifact, prompts) -> tuple[list[list[int]], list[list[torch.Tensor]]]:
    """transformers + compressed-tensors' default load of the artifact (fp8 weights decompressed,
    activations fake-quantized per token), greedy, log-softmax of each step's raw logits (not the
    processed scores: min_new_tokens sets EOS to -inf there)."""
    import warnings

    from transformers import AutoModelForCausalLM

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = AutoModelForCausalLM.from_pretrained(str(artifact), dtype=torch.bfloat16).eval()
    tokens, lps = [], []
    for ids in prompts:
        with torch.no_grad():
            x = torch.tensor([ids])  # an explicit mask: without one generate masks every pad-id prompt token
            out = model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=STEPS, min_new_tokens=STEPS,
                                 do_sample=False, output_logits=True, return_dict_in_generate=True,
                                 pad_token_id=0)
        tokens.append(out.sequences[0, len(ids):].tolist())
        lps.append([torch.log_softmax(s[0].float(), -1) for s in out.logits])  # raw: before min_new_tokens
    return tokens, lps


def divergence_problems(name, hf_tokens, hf_lps, v_tokens, v_lps) -> tuple[list[str], dict]:
    """Greedy tokens agree until the first step where they differ; there, transformers picks a and
    vLLM b. Each engine's log-probability of a token differs from the other's by at most the noise
    N (the largest |delta logprob| of vLLM's top-20 tokens on the steps both agreed on, any prompt), so
    margin_hf(a over b) + margin_vllm(b over a) = (hf[a] - v[a]) - (hf[b] - v[b]) <= 2 N:
    a larger sum is a real disagreement, not rounding."""
    deltas, spread, splits = [], [TOL_FLOOR], []
    for p, (ht, vt) in enumerate(zip(hf_tokens, v_tokens)):
        t = next((i for i, (a, b) in enumerate(zip(ht, vt)) if a != b), None)
        for i in range(len(ht) if t is None else t):
            deltas.append(abs(v_lps[p][i][str(ht[i])] - float(hf_lps[p][i][ht[i]])))
            # the runner-ups too (vLLM's top 20): a divergence is between a top token and a runner-up
            spread += [abs(x - float(hf_lps[p][i][int(k)])) for k, x in v_lps[p][i].items()]
        if t is not None:
            splits.append((p, t, ht[t], vt[t]))
    noise = max(spread)
    bad = []
    for p, t, a, b in splits:
        v = {int(k): x for k, x in v_lps[p][t].items()}
        hf_margin = float(hf_lps[p][t][a] - hf_lps[p][t][b])
        v_margin = v[b] - v[a] if a in v else math.inf
        if hf_margin + v_margin > 2 * noise:
            bad.append(f"{name} prompt {p} step {t}: transformers {a} (margin {hf_margin:.4f}) vs vLLM {b} "
                       f"(margin {v_margin:.4f}): {hf_margin + v_margin:.4f} > 2 x noise {noise:.4f}")
    stats = {"agreed_tokens": len(deltas), "divergences": len(splits), "noise_max": noise,
             "mean_abs_dlogprob": sum(deltas) / max(len(deltas), 1)}
    return bad, stats


@pytest.fixture(scope="module")
def generated(tmp_path_factory, vllm_py):
    from tfcompile.fixtures.smollm2 import smollm2_checkpoint

    root = tmp_path_factory.mktemp("engine-generate")
    arts = {n: quantize(_dense(n, root / n), root / f"{n}-fp8-dynamic", "fp8-dynamic") for n in DENSE}
    arts["smollm2"] = quantize(smollm2_checkpoint(), root / "smollm2-fp8-dynamic", "fp8-dynamic")
    prompts = {str(a): _prompts(a) for a in arts.values()}
    req = root / "request.json"
    req.write_text(json.dumps({"prompts": prompts, "max_tokens": STEPS, "logprobs": 20, "max_model_len": 256}))
    outs = run_driver(vllm_py, "generate", req, *arts.values(), timeout=1800)
    return {n: (a, prompts[str(a)], o) for (n, a), o in zip(arts.items(), outs)}


@pytest.mark.parametrize("name", [*DENSE, "smollm2"])
def test_vllm_greedy_equals_transformers_on_fp8_dynamic(name, generated):
    artifact, prompts, out = generated[name]
    assert "error" not in out, f"{name}: vLLM could not serve the artifact: {out['error']}\n{out.get('traceback')}"
    hf_tokens, hf_lps = _transformers_greedy(artifact, prompts)
    bad, stats = divergence_problems(name, hf_tokens, hf_lps, out["tokens"], out["logprobs"])
    print(f"{name}: {stats}")
    assert not bad, "\n".join(bad)
    assert stats["mean_abs_dlogprob"] < 0.2, stats  # the same weights: only kernel rounding differs
