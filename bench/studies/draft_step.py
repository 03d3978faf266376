"""SmolLM2-135M: what one `tfcompile draft` training step costs, before and after the target cache.

Before (up to 6a60bf4's parent) every step ran the frozen target on its batch; now the target
runs once per training sequence (tfcompile.draft.train.TargetCache) and a step costs the draft
alone. Times, on one batch of --batch x --seq-len tokens, medians of --runs:

  target_s  the target forward a step used to run (fused hidden states + draft-vocabulary log-probs)
  step_s    a cached step: the draft's chain forward (--ttt-steps), its KL loss and backward

    python -m bench run draft_step [--batch 4] [--seq-len 128] [--draft-vocab 8192] [--runs 3] [--threads N]

prints one JSON line (with the machine line and the load average at the start).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

from bench.common import machine_line  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--draft-vocab", type=int, default=8192)
    ap.add_argument("--ttt-steps", type=int, default=3)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    args = ap.parse_args()
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)

    from tfcompile.draft.config import DraftConfig
    from tfcompile.draft.run import _config, _keep, build_draft, load_target
    from tfcompile.draft.train import TargetCache, ttt_loss
    from tfcompile.fixtures.smollm2 import smollm2_checkpoint

    load = os.getloadavg()[0]
    smol = Path(smollm2_checkpoint())
    target, cfg_json, _ = load_target(smol, None)
    tokens = torch.randint(0, int(cfg_json["vocab_size"]), (args.batch, args.seq_len),
                           generator=torch.Generator().manual_seed(0))
    draft = build_draft(target, _config(smol), DraftConfig(draft_vocab=args.draft_vocab), tokens)
    keep, idx = _keep(draft), torch.arange(args.batch)
    target_s, step_s = [], []
    for _ in range(args.runs):
        t0 = time.perf_counter()
        cache = TargetCache(target, tokens, draft.s.aux_layers, keep, chunk=args.batch)
        target_s.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        fused, logp = cache.batch(idx, "cpu")
        loss, _ = ttt_loss(draft, tokens, fused, logp, args.ttt_steps, 1.0)
        loss.backward()
        step_s.append(time.perf_counter() - t0)
    print(json.dumps({"batch": args.batch, "seq_len": args.seq_len, "draft_vocab": args.draft_vocab,
                      "ttt_steps": args.ttt_steps, "runs": args.runs,
                      "target_s": round(statistics.median(target_s), 2), "step_s": round(statistics.median(step_s), 2),
                      "threads": torch.get_num_threads(), "load": round(load, 1), "machine": machine_line()}))


if __name__ == "__main__":
    main()
