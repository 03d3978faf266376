"""Training inputs of `tfcompile draft`: the cached target outputs and the start from the target.

Oracle: the target's own full forward (transformers' LlamaForCausalLM with output_hidden_states):
the cache must hand a step the fused hidden states and the log-probabilities over the draft
vocabulary that a forward of the same rows gives.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

DEMO = Path(__file__).resolve().parents[2] / "examples" / "demo-lm"


@pytest.fixture(scope="module")
def target():
    from tfcompile.evaluate.models import load_checkpoint_model

    return load_checkpoint_model(DEMO, torch.float32, "reference")


@pytest.mark.parametrize("reduced", [True, False])
@pytest.mark.parametrize("place", ["memory", "disk"])
def test_the_cache_gives_what_a_target_forward_gives(target, reduced, place, tmp_path):
    from tfcompile.draft.cache import TargetCache

    tokens = torch.randint(0, 4096, (11, 24), generator=torch.Generator().manual_seed(0))  # 11: chunks of 8 + 3
    keep = torch.tensor([0, 5, 17, 300, 4095]) if reduced else None
    aux = (1, 2, 3)
    cache = TargetCache(target, tokens, aux, keep, place=place, folder=tmp_path)
    idx = torch.tensor([9, 2, 10])
    fused, logp = cache.batch(idx, "cpu")
    if place == "disk":  # one file per chunk of 8 sequences, read back bit for bit
        assert sorted(p.name for p in tmp_path.iterdir()) == ["tcache-00000.safetensors", "tcache-00001.safetensors"]
        mem = TargetCache(target, tokens, aux, keep).batch(idx, "cpu")
        assert torch.equal(fused, mem[0]) and torch.equal(logp, mem[1])
    with torch.no_grad():
        out = target(input_ids=tokens[idx], output_hidden_states=True)
    logits = out.logits.float() if keep is None else out.logits.float()[..., keep]
    torch.testing.assert_close(fused, torch.cat([out.hidden_states[i] for i in aux], -1), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(logp, torch.log_softmax(logits, -1), rtol=1e-5, atol=1e-5)
    assert logp.shape == (3, 24, 5 if reduced else 4096)


def test_a_bfloat16_cache_holds_the_float32_values_rounded(target, tmp_path):
    """Oracle: torch's own float32 -> bfloat16 rounding of the float32 cache's values."""
    from tfcompile.draft.cache import TargetCache

    tokens = torch.randint(0, 4096, (9, 16), generator=torch.Generator().manual_seed(2))
    keep, idx = torch.tensor([1, 7, 4000]), torch.tensor([8, 0])
    f32 = TargetCache(target, tokens, (1, 2, 3), keep)
    bf16 = TargetCache(target, tokens, (1, 2, 3), keep, dtype="bfloat16", place="disk", folder=tmp_path)
    want = f32.store.rows(idx)
    got = bf16.store.rows(idx)
    for k in ("fused", "last"):
        assert got[k].dtype == torch.bfloat16 and torch.equal(got[k], want[k].to(torch.bfloat16))
    fused, logp = bf16.batch(idx, "cpu")
    assert fused.dtype == torch.float32 and torch.equal(fused, want["fused"].to(torch.bfloat16).float())
    head = target.get_output_embeddings().weight[keep]
    ref = torch.log_softmax(want["last"].to(torch.bfloat16).float() @ head.T, -1)
    torch.testing.assert_close(logp, ref, rtol=1e-6, atol=1e-6)
    assert not torch.equal(fused, f32.batch(idx, "cpu")[0])  # the rounding is real


def test_the_draft_starts_from_the_target(target):
    from tfcompile.draft.config import DraftConfig
    from tfcompile.draft.run import _config, build_draft

    tokens = torch.randint(0, 4096, (2, 16), generator=torch.Generator().manual_seed(1))
    draft = build_draft(target, _config(DEMO), DraftConfig(init="target"), tokens)
    aux = draft.s.aux_layers
    src = target.get_decoder().layers[aux[-1]]
    with torch.no_grad():
        hs = target(input_ids=tokens, output_hidden_states=True).hidden_states
        fused = torch.cat([hs[i] for i in aux], -1)
        # fc passes the highest fused state through
        torch.testing.assert_close(draft.fc(fused), hs[aux[-1]], rtol=0, atol=0)
        lay = draft.layers[0]
        x = torch.randn(3, draft.s.hidden)
        torch.testing.assert_close(lay.mlp(x), src.mlp(x), rtol=1e-6, atol=1e-6)
        q = lay.self_attn.q_proj.weight
        H = draft.s.hidden
        assert torch.equal(q[:, :H], src.self_attn.q_proj.weight) and torch.equal(q[:, H:], src.self_attn.q_proj.weight)
        assert torch.equal(lay.hidden_norm.weight, src.input_layernorm.weight)
        assert torch.equal(draft.norm.weight, target.get_decoder().norm.weight)
    rnd = build_draft(target, _config(DEMO), DraftConfig(init="random"), tokens)
    assert not torch.equal(rnd.layers[0].mlp.up_proj.weight, src.mlp.up_proj.weight)


def test_self_generated_data_is_the_targets_greedy_decoding(target):
    """greedy_continue (batched, KV cache, head on the last position only) continues each prompt
    exactly as spec.greedy (one unbatched full forward per token) does: the exactness oracle."""
    from tfcompile.draft.spec import Target, greedy
    from tfcompile.draft.train import greedy_continue

    prompts = torch.randint(0, 4096, (3, 8), generator=torch.Generator().manual_seed(1))
    out = greedy_continue(target, prompts, 20, batch=2)  # batches of 2 + 1
    assert out.shape == (3, 20) and torch.equal(out[:, :8], prompts)
    for row, p in zip(out, prompts):
        assert row[8:].tolist() == greedy(Target(target), p.tolist(), 12)


def test_init_from_continues_the_written_draft_and_refuses_another_targets(target, tiny_draft, tmp_path):
    """--init-from: the draft starts as the one written (weights, vocabulary mapping), with the
    target's embeddings and head frozen; a draft whose shape is not this target's is refused."""
    from tfcompile.draft.config import DraftConfig
    from tfcompile.draft.format import load_draft
    from tfcompile.draft.run import _config, build_draft
    from tfcompile.errors import UserError

    tokens = torch.randint(0, 4096, (8, 16), generator=torch.Generator().manual_seed(2))
    written = load_draft(tiny_draft)
    got = build_draft(target, _config(DEMO), DraftConfig(init_from=str(tiny_draft), init="random"), tokens)
    want = written.state_dict()
    assert set(got.state_dict()) == set(want)
    for name, t in got.state_dict().items():
        assert torch.equal(t, want[name]), name
    assert not got.embed_tokens.weight.requires_grad and not got.lm_head.weight.requires_grad
    assert got.fc.weight.requires_grad
    other = dict(_config(DEMO), hidden_size=2 * int(_config(DEMO)["hidden_size"]))
    with pytest.raises(UserError, match="--init-from") as err:
        build_draft(target, other, DraftConfig(init_from=str(tiny_draft)), tokens)
    assert err.value.hint


@pytest.fixture(scope="module")
def nvfp4a16_demo(tmp_path_factory) -> Path:
    from tfcompile.cli.main import main

    out = tmp_path_factory.mktemp("art") / "demo-nvfp4a16"
    assert main(["quantize", str(DEMO), "-o", str(out), "--format", "nvfp4a16", "-q"]) == 0
    return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_cache_of_an_artifact_target_gives_its_served_forward(nvfp4a16_demo, dtype):
    """Case (d)'s target: the artifact as `tfcompile eval` serves it, in --compute-dtype. Oracle: that
    module's own forward (logits from its head, whole vocabulary: keep=None runs the head as the
    target runs it). bfloat16: the cache keeps the states bf16 computed, widened to float32."""
    from tfcompile.draft.cache import TargetCache
    from tfcompile.draft.run import load_target

    target, _, served = load_target(DEMO, nvfp4a16_demo, dtype)
    assert served == "artifact:nvfp4a16" and next(target.parameters()).dtype == dtype
    tokens = torch.randint(0, 4096, (5, 16), generator=torch.Generator().manual_seed(3))
    aux, idx = (1, 2, 3), torch.tensor([4, 1])
    fused, logp = TargetCache(target, tokens, aux, None).batch(idx, "cpu")
    with torch.no_grad():
        out = target(input_ids=tokens[idx], output_hidden_states=True)
    assert fused.dtype == logp.dtype == torch.float32
    assert torch.equal(fused, torch.cat([out.hidden_states[i] for i in aux], -1).float())
    torch.testing.assert_close(logp, torch.log_softmax(out.logits.float(), -1), rtol=1e-5, atol=1e-5)
    if dtype == torch.bfloat16:  # bf16 forwards are the float32 ones rounded along the way: near, not equal
        ref, _, _ = load_target(DEMO, nvfp4a16_demo, torch.float32)
        with torch.no_grad():
            want = torch.log_softmax(ref(input_ids=tokens[idx]).logits.float(), -1)
        kl = (want.exp() * (want - logp)).sum(-1).mean()
        assert 0 < kl < 0.05, kl
