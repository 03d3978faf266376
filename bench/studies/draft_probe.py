"""SmolLM2-135M: why an EAGLE-3 draft is or is not accepted, measured without speculative decoding.

On the prompts bench/draft.py measures (python-doc's held-out split, --prompts x 64 tokens) the
bf16 target continues each prompt greedily (--new-tokens); on those sequences the draft runs its
training forward (Eagle3Draft.ttt, the same function decoding runs: tests/draft/test_eagle3.py) and
this prints one JSON line with

  coverage      the share of the target's generated tokens inside the draft vocabulary (a token
                outside it can never be proposed, so never accepted)
  seen_earlier  the share of generated tokens that occur earlier in their own sequence (prompt or
                output): what prompt lookup can copy
  agreement     per chain step j, how often the draft's argmax equals the target's on the generated
                part, fed the target's own tokens (step j's row predicts position i + 2 + j)

    python -m bench run draft_probe --draft DIR [--prompts 8] [--new-tokens 64] [--threads 1]
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from bench.common import machine_line

PROMPT = 64


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--draft", type=Path, required=True)
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    import torch

    from tfcompile.draft.acceptance import prompts_of
    from tfcompile.draft.format import load_draft
    from tfcompile.draft.run import _keep
    from tfcompile.draft.train import TargetCache, greedy_continue
    from tfcompile.evaluate.models import load_checkpoint_model
    from tfcompile.evaluate.text import load_tokenizer
    from tfcompile.fixtures.smollm2 import smollm2_checkpoint

    torch.set_num_threads(args.threads)
    load = os.getloadavg()[0]
    smol = Path(smollm2_checkpoint())
    target = load_checkpoint_model(smol, torch.float32, "reference").eval()
    rows = prompts_of(None, load_tokenizer(smol), count=args.prompts, prompt_len=PROMPT, vocab=49152)
    seqs = greedy_continue(target, torch.tensor(rows), PROMPT + args.new_tokens)  # [N, P + new]
    draft = load_draft(args.draft)
    gen = seqs[:, PROMPT:]
    coverage = 1.0 if draft.t2d is None else float(draft.t2d[gen].float().mean())
    seen = [int(seqs[i, PROMPT + j]) in seqs[i, :PROMPT + j].tolist() for i in range(len(seqs)) for j in range(gen.shape[1])]
    fused, logp = TargetCache(target, seqs, draft.s.aux_layers, _keep(draft)).batch(torch.arange(len(seqs)), "cpu")
    with torch.no_grad():
        steps = draft.ttt(seqs, fused, 3)
    T, agree = seqs.shape[1], []
    for j, lg in enumerate(steps):
        n = T - 1 - j
        q, p = lg[:, :n].argmax(-1), logp[:, 1 + j:1 + j + n].argmax(-1)
        first = PROMPT - 2 - j  # the first row predicting a generated token (position i + 2 + j >= PROMPT)
        agree.append(round(float((q[:, first:] == p[:, first:]).float().mean()), 3))
    print(json.dumps({"draft": str(args.draft), "prompts": len(rows), "new_tokens": args.new_tokens,
                      "coverage": round(coverage, 4), "seen_earlier": round(sum(seen) / len(seen), 4),
                      "agreement": agree, "load": round(load, 1), "machine": machine_line()}))


if __name__ == "__main__":
    main()
