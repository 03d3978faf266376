"""Quantize a checkpoint with llm-compressor (run in its own venv; bench/peers.py drives it).

llm-compressor 0.14 pins transformers <= 5.17 and compressed-tensors 0.19, so it lives in a
separate virtual environment (the project's keeps the versions CI resolves). This script imports
nothing from tfcompile. Calibration tokens come from a file bench/peers.py wrote with tfcompile's
own `--calib python-doc` tokens, so both tools calibrate on the same ids.

    python bench/peers_llmc.py MODEL OUT --scheme NVFP4A16 --method rtn|gptq --tokens ids.npy [--dump DIR]
    python bench/peers_llmc.py MODEL OUT --scheme NVFP4A16 --method rtn      (data-free: no tokens, no tokenizer)

--dump DIR (GPTQ): the inputs of each of llm-compressor's `quantize_weight` calls, one torch file per
call (module names, normalized Hessians [B, K, K], observer block scales, global scales), for
bench/studies/acc_gptq_spread.py to solve them with tfcompile's GPTQ.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
import torch


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("out")
    ap.add_argument("--scheme", required=True, help="compressed-tensors preset, e.g. NVFP4A16, FP8_DYNAMIC")
    ap.add_argument("--method", choices=["rtn", "gptq"], required=True)
    ap.add_argument("--tokens", help=".npy int64 [samples, seq_len] (required for gptq; rtn runs data-free without)")
    ap.add_argument("--dump", help="directory for the GPTQ solves' inputs (module docstring)")
    args = ap.parse_args()

    from datasets import Dataset
    from llmcompressor import oneshot
    from llmcompressor.modifiers.quantization import GPTQModifier, QuantizationModifier
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(0)
    if args.tokens is None and args.method != "rtn":
        ap.error("--tokens is required for --method gptq")
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.bfloat16)
    data = {}  # data-free RTN: oneshot with no dataset, as llm-compressor's FP8_DYNAMIC/NVFP4A16 examples
    if args.tokens is not None:
        ids = np.load(args.tokens)
        ds = Dataset.from_dict({"input_ids": ids.tolist(), "attention_mask": np.ones_like(ids).tolist()})
        data = dict(dataset=ds, max_seq_length=ids.shape[1], num_calibration_samples=ids.shape[0],
                    tokenizer=AutoTokenizer.from_pretrained(args.model))
    if args.dump:
        _dump_gptq_inputs(model, args.dump)
    ignore = ["lm_head"]
    if args.method == "gptq":  # llm-compressor's defaults: block 128, dampening 0.01, act-order static
        recipe = GPTQModifier(targets="Linear", scheme=args.scheme, ignore=ignore)
    else:
        recipe = QuantizationModifier(targets="Linear", scheme=args.scheme, ignore=ignore)
    t0 = time.perf_counter()
    oneshot(model=model, recipe=recipe, **data)
    model.save_pretrained(args.out, save_compressed=True)
    if "tokenizer" in data:
        data["tokenizer"].save_pretrained(args.out)
    print(json.dumps({"seconds": round(time.perf_counter() - t0, 1)}))
    return 0


def _dump_gptq_inputs(model: torch.nn.Module, out: str) -> None:
    """Wrap llm-compressor 0.14's GPTQ entry points (llmcompressor/modifiers/gptq/base.py calls
    `prepare_batch` then `quantize_weight` per batch of modules) to save each call's inputs."""
    import os

    import llmcompressor.modifiers.gptq.base as base

    os.makedirs(out, exist_ok=True)
    names = {m: n for n, m in model.named_modules()}
    batch_names: list[str] = []
    prepare, solve = base.prepare_batch, base.quantize_weight

    def prepare_batch(batch, *a, **k):
        batch_names[:] = [names[m] for m in batch]
        return prepare(batch, *a, **k)

    def quantize_weight(weights, hessians, scale, zero_point, global_scale, *a, **k):
        rec = {"names": list(batch_names), "hessians": hessians.float().cpu().clone(),
               "scale": scale.float().cpu().clone(),
               "global_scale": None if global_scale is None else global_scale.float().cpu().reshape(-1).clone()}
        torch.save(rec, os.path.join(out, f"{len(os.listdir(out)):04d}.pt"))
        return solve(weights, hessians, scale, zero_point, global_scale, *a, **k)

    base.prepare_batch, base.quantize_weight = prepare_batch, quantize_weight


if __name__ == "__main__":
    raise SystemExit(main())
