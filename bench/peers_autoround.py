"""Quantize a checkpoint with auto-round (SignRound) in its own venv; bench/acc_autoround.py drives it.

auto-round 0.16 lives in /work/venvs/autoround (never a tfcompile dependency). This script imports
nothing from tfcompile. Calibration ids come from a .npy file bench/acc_autoround.py wrote with
tfcompile's own `--calib python-doc` tokens, so both tools tune on the same sequences.

    python bench/peers_autoround.py MODEL OUT --scheme nvfp4a16|mxfp4a16 --tokens ids.npy --iters N [--batch B]

The weights are tuned and fake-quantized by auto-round in float32 (its `fake` export: every
quantized Linear holds its dequantized weight), so tfcompile's eval scores them as a plain
checkpoint; lm_head is left unquantized as in tfcompile's presets. Prints one JSON line: seconds
of auto-round's quantize call, iters, batch.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np  # noqa: E402
import torch  # noqa: E402

# W4A16 schemes as auto-round spells them (its NVFP4 / MXFP4 presets quantize activations too)
SCHEMES = {
    "nvfp4a16": {"bits": 4, "group_size": 16, "data_type": "nv_fp", "sym": True, "act_bits": 16},
    "mxfp4a16": {"bits": 4, "group_size": 32, "data_type": "mx_fp", "sym": True, "act_bits": 16},
}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("out")
    ap.add_argument("--scheme", choices=sorted(SCHEMES), required=True)
    ap.add_argument("--tokens", required=True, help=".npy int64 [samples, seq_len]")
    ap.add_argument("--iters", type=int, default=200)
    ap.add_argument("--batch", type=int, default=8)
    args = ap.parse_args()

    from auto_round import AutoRound
    from auto_round.schemes import QuantizationScheme
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(0)
    ids = torch.from_numpy(np.load(args.tokens))
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(args.model)
    data = [ids[i: i + 1] for i in range(ids.shape[0])]  # one [1, seq_len] tensor per sample
    ar = AutoRound(model, tok, scheme=QuantizationScheme.from_dict(SCHEMES[args.scheme]), dataset=data,
                   nsamples=ids.shape[0], seqlen=ids.shape[1], iters=args.iters, batch_size=args.batch,
                   layer_config={"lm_head": {"bits": 16}}, seed=42)
    t0 = time.perf_counter()
    ar.quantize_and_save(args.out, format="fake")
    seconds = time.perf_counter() - t0
    print(json.dumps({"autoround_s": round(seconds, 1), "iters": args.iters, "batch": args.batch}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
