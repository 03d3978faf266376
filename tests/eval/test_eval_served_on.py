"""`tfcompile eval --served-on vllm:sm_100a`: score what the engine serves, not what is written.

vLLM 0.32 reads a weight-only MXFP4 artifact (mxfp4a16) as W4A4 and, on sm_100 with FlashInfer,
quantizes its activations to MXFP4 (issue 26; vLLM #56770; docs/interop.md). The artifact is right
(compressed-tensors' weight-only scheme); what the engine serves is the W4A4 model, so `eval
--served-on vllm:sm_100a` emulates the W4A4 activations on it. The independent oracle: the mxfp4
(W4A4) artifact of the same source, whose weights are the same bytes and whose activation emulation
is the written one.
"""

from __future__ import annotations

import torch

from tfcompile.io.checkpoint import open_checkpoint

SMALL = ("--max-tokens", "256", "--seq-len", "64", "--batch-size", "4")


def _tensors(path) -> dict[str, torch.Tensor]:
    with open_checkpoint(path) as ckpt:
        return {n: ckpt.get(n).clone() for n in ckpt.names()}  # copies: the mapping closes with ckpt


def test_mxfp4a16_served_on_sm100_is_the_w4a4_model(eval_artifact):
    from tfcompile.evaluate.models import load_candidate

    a16, w4a4 = eval_artifact("mxfp4a16"), eval_artifact("mxfp4")
    ta, tw = _tensors(a16), _tensors(w4a4)
    assert ta.keys() == tw.keys() and all(torch.equal(ta[k], tw[k]) for k in ta)  # the same weights
    ids = torch.randint(4, 200, (2, 24), generator=torch.Generator().manual_seed(0))

    def logits(path, **kw):
        with torch.no_grad():
            return load_candidate(path, torch.float32, **kw).model(ids).logits

    written, served = logits(a16), logits(a16, act_as={"mxfp4a16": "mxfp4"})
    assert torch.equal(served, logits(w4a4))  # bit for bit the W4A4 model
    assert not torch.equal(written, served)  # as written: activations not quantized


def test_eval_cli_served_on(run_cli, eval_artifact, tiny_llama, eval_text):
    art = eval_artifact("mxfp4a16")
    docs = {}
    for extra in ((), ("--served-on", "vllm:sm_100a"), ("--served-on", "vllm:sm_90a")):
        r = run_cli("eval", art, "--reference", tiny_llama, "--text", eval_text, *SMALL, "--json", *extra)
        assert r.code == 0, r.err
        docs[extra[1] if extra else None] = r.json()
    assert docs["vllm:sm_100a"]["activations_as_served"] == {"mxfp4a16": "mxfp4"}
    assert docs[None]["activations_as_served"] == {} == docs["vllm:sm_90a"]["activations_as_served"]
    kl = {k: d["metrics"]["kl_mean"] for k, d in docs.items()}
    assert kl[None] == kl["vllm:sm_90a"] < kl["vllm:sm_100a"]  # Marlin serves it weight-only, as written
    r = run_cli("eval", art, "--reference", tiny_llama, "--text", eval_text, "--served-on", "trtllm:sm_100a")
    assert r.code == 2 and "served-on" in r.err
