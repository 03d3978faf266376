"""SmolLM2-135M: what learned rounding costs per decoder block, before and after the step rewrite.

`tune_block` (passes/quantize/signround.py) on one decoder block of the SmolLM2 fixture (float32,
the block's inputs from the model's own forward on --batches x 512 python-doc calibration tokens),
offsets only (the default), --iters signed-gradient steps, one torch thread as the layer loop runs it:

  before  the general quantizer every step (the multiplier, W / m and the grid step recomputed, the
          straight-through estimate as autograd ops) and 8 full-calibration checkpoints: the code
          up to 8d7bb1b's parent
  after   the offsets-only node (`_OffsetRound`, the grid precomputed) and 4 checkpoints

The two are interleaved in one process, --runs each; prints one JSON line with the medians, the
machine line and the load average at the start.

    python -m bench run signround_step [--layer 3] [--iters 16] [--batches 16] [--runs 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

from bench.common import machine_line  # noqa: E402


def _block_inputs(model, layer_index: int, ids):
    """[(hidden, kwargs)] the block receives per calibration sequence, and its float outputs."""
    import torch

    layer, caught = model.model.layers[layer_index], []

    def hook(_mod, args, kwargs):
        caught.append((args[0].detach(), dict(kwargs)))
        raise StopIteration  # the rest of the model is not needed

    handle = layer.register_forward_pre_hook(hook, with_kwargs=True)
    with torch.no_grad():
        for row in ids:
            try:
                model(row[None], use_cache=False)
            except StopIteration:
                pass
    handle.remove()
    with torch.no_grad():
        targets = [layer(h, **kw)[0] for h, kw in caught]
    return layer, caught, targets


def _rounders(layer, fast: bool) -> dict:
    from tfcompile.kernels.formats.quantizer import weight_quantizer
    from tfcompile.passes.quantize.signround_math import LearnedRounding

    wq, out = weight_quantizer("nvfp4"), {}
    for name, p in layer.named_parameters():
        if p.dim() == 2:
            w = p.detach()
            r = LearnedRounding(w, wq.quantize(w, global_scale=wq.group_global_scale([w]), rule="floor"),
                                "floor", "cpu", scales=False)
            if not fast:
                r._fixed = None  # the general path, as every step ran before
            out[name] = r
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layer", type=int, default=3)
    ap.add_argument("--iters", type=int, default=16)
    ap.add_argument("--batches", type=int, default=16)
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    import torch
    from transformers import AutoModelForCausalLM

    from tfcompile.calibration.datasets import calibration_tokens
    from tfcompile.calibration.forward import load_tokenizer
    from tfcompile.fixtures.smollm2 import smollm2_checkpoint
    from tfcompile.passes.quantize import signround

    load = os.getloadavg()[0]
    torch.set_num_threads(1)
    path = smollm2_checkpoint()
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    ids = calibration_tokens("python-doc", load_tokenizer(path), samples=args.batches, seq_len=512, seed=0)
    layer, inputs, targets = _block_inputs(model, args.layer, ids)
    times: dict[str, list[float]] = {"before": [], "after": []}
    for _ in range(args.runs):
        for name, fast, checkpoints in (("before", False, 8), ("after", True, 4)):
            signround.CHECKPOINTS = checkpoints
            rounders = _rounders(layer, fast)
            t0 = time.perf_counter()
            signround.tune_block(layer, rounders, inputs, targets, iters=args.iters, lr=1 / args.iters, seed=0)
            times[name].append(round(time.perf_counter() - t0, 2))
    med = {k: statistics.median(v) for k, v in times.items()}
    print(json.dumps({"seconds": times, "median_s": med, "ratio": round(med["before"] / med["after"], 2),
                      "load_at_start": round(load, 1), "cpu_capability": torch.backends.cpu.get_cpu_capability(),
                      "machine": machine_line(), **vars(args)}))


if __name__ == "__main__":
    main()
