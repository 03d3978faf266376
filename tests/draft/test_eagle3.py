"""The EAGLE-3 head against speculators' own model, decode-time state against training, the format.

Oracle: speculators' Eagle3DraftModel (a real client no one here wrote) loads the written
directory with its own config loader and weight loader; its training-time-test forward must
give our logits at every chain step. Our decode-time chain (DraftState) must propose what
the training forward predicts at the same index.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tfcompile.draft.eagle3 import DraftState
from tfcompile.draft.format import load_draft
from tfcompile.errors import UserError


@pytest.fixture(scope="module")
def random_draft(tmp_path_factory):
    """An untrained draft of the demo LM's shape, seeded: its attention is not yet saturated (a trained
    tiny draft's often attends one-hot), so a wrong mask or position shows in the logits."""
    DEMO = Path(__file__).resolve().parents[2] / "examples" / "demo-lm"
    from tfcompile.draft.config import DraftConfig
    from tfcompile.draft.format import speculators_config, write_draft
    from tfcompile.draft.run import _config, build_draft
    from tfcompile.evaluate.models import load_checkpoint_model

    target = load_checkpoint_model(DEMO, torch.float32, "reference")
    cfg = _config(DEMO)
    draft = build_draft(target, cfg, DraftConfig(init="random"), torch.zeros(1, 8, dtype=torch.int64))
    out = tmp_path_factory.mktemp("random-draft")
    write_draft(out, draft, speculators_config(cfg, draft.s, verifier=str(DEMO), speculative_tokens=3))
    return out


@pytest.fixture(scope="module", params=["tiny_draft", "random_draft"])
def draft_dir(request):
    return request.getfixturevalue(request.param)


def _speculators(path):
    from speculators import SpeculatorModelConfig
    from speculators.models.eagle3 import Eagle3DraftModel

    cfg = SpeculatorModelConfig.from_pretrained(str(path))
    cfg.transformer_layer_config._attn_implementation = "eager"  # flex attention needs compile on CPU
    return cfg, Eagle3DraftModel.from_pretrained(str(path), config=cfg, dtype=torch.float32).eval()


def test_speculators_loads_the_config(tiny_draft):
    cfg, _ = _speculators(tiny_draft)
    assert type(cfg).__name__ == "Eagle3SpeculatorConfig"
    assert cfg.speculators_config.algorithm == "eagle3"
    assert cfg.speculators_config.verifier.architectures == ["LlamaForCausalLM"]
    assert cfg.speculators_config.verifier.name_or_path.endswith("demo-lm")
    assert cfg.eagle_aux_hidden_state_layer_ids == [1, 2, 3]
    assert cfg.transformer_layer_config.num_hidden_layers == 1 and cfg.draft_vocab_size == 4096


def test_our_chain_logits_equal_speculators_forward(draft_dir):
    _, ref = _speculators(draft_dir)
    ours = load_draft(draft_dir)
    T = 24
    x = torch.randint(0, 4096, (1, T))
    aux = torch.randn(1, T, 3 * 256)
    got = []
    hook = ref.lm_head.register_forward_hook(lambda mod, inp, out: got.append(out))
    with torch.no_grad():  # speculators' alignment: input_ids x[1:], hidden states g[:-1]
        ref(hidden_states=aux[:, :-1], input_ids=x[:, 1:], document_ids=torch.zeros(1, T - 1, dtype=torch.long),
            ttt_steps=3)
        mine = ours.ttt(x, aux, 3)
    hook.remove()
    assert len(got) == 3
    for j in range(3):
        torch.testing.assert_close(mine[j], got[j], rtol=1e-4, atol=1e-4)


def test_decode_chain_equals_the_training_forward(draft_dir):
    """propose(seq, k): step j's logits == training step j's at the last index, fed the proposals."""
    d = load_draft(draft_dir)
    n, k = 20, 4
    seq = torch.randint(0, 4096, (n,)).tolist()
    g = torch.randn(n + k, 3 * 256)
    state = DraftState(d)
    state.extend(g[:5])
    state.propose(seq[:6], 2)  # an earlier round: the step-0 cache is filled in two parts
    state.extend(g[5:n - 1])
    drafted = state.propose(seq, k)
    x = torch.tensor([seq + drafted[:-1]])
    with torch.no_grad():
        steps = d.ttt(x, g[: x.shape[1]].unsqueeze(0), k)
    assert drafted == [int(steps[j][0, n - 2].argmax()) for j in range(k)]
    for j in range(k):
        torch.testing.assert_close(state.logits[j], steps[j][0, n - 2], rtol=1e-4, atol=1e-4)


def test_reduced_vocabulary_maps_back_to_target_ids():
    from tfcompile.draft.config import shape_of
    from tfcompile.draft.eagle3 import Eagle3Draft
    from tfcompile.draft.train import draft_vocab

    keep = draft_vocab(torch.tensor([[7, 7, 7, 3, 3, 9, 1]]), 10, 3)
    assert keep.tolist() == [1, 3, 7]  # the most frequent; of the tied 1 and 9 the lower id
    s = shape_of({"model_type": "llama", "hidden_size": 8, "intermediate_size": 16, "num_attention_heads": 2,
                  "vocab_size": 10}, 3, (0, 1, 2))
    d = Eagle3Draft(s)
    d.d2t.copy_(keep - torch.arange(3))
    assert d.to_target(torch.tensor([0, 1, 2])).tolist() == keep.tolist()


def test_a_non_draft_directory_is_refused(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    with pytest.raises(UserError, match="not an EAGLE-3 speculators draft"):
        load_draft(tmp_path)
