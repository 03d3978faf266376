"""fp8-dynamic on SmolLM2: tfcompile's artifact re-quantized under llm-compressor's rounding rules.

docs/accuracy.md "where llm-compressor is ahead": builds tfcompile's fp8-dynamic artifact and
llm-compressor's (bench/peers_llmc.py in its venv), then four variants of ours, each weight
re-quantized from the bf16 checkpoint with the scale rounded up / to nearest bf16 and w / scale
computed in float32 / bf16, and ours with every scale one or two bf16 steps larger (the spread
of equally valid roundings); scores each as
bench/peers.py does (transformers + compressed-tensors, held-out python-doc) and prints the
weight SQNR and whether a variant is bit-identical to llm-compressor's artifact.

    python -m bench run fp8_rounding [--max-tokens 8192] [--work DIR] [--llmc-python PY]
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from bench.heldout import LLMC_PYTHON, HeldOut, calib_ids

REPO = Path(__file__).resolve().parents[2]

VARIANTS = {"up/float32": ("up", "float32"), "nearest/float32": ("nearest", "float32"),
            "up/bf16": ("up", "bf16"), "nearest/bf16": ("nearest", "bf16"),
            # the spread of equally valid roundings: tfcompile's rule with every scale 1 or 2 bf16
            # steps larger (still no element clips; each step is 0.4-0.8% of the scale)
            "up+1/float32": ("up+1", "float32"), "up+2/float32": ("up+2", "float32")}


def scale(w: torch.Tensor, rule: str) -> torch.Tensor:
    """amax / 448 per row as bf16: rounded to nearest, or up (the smallest bf16 >= it), or up and
    then `up+k`: k bf16 steps larger."""
    s = w.float().abs().amax(1, keepdim=True) / 448
    b = s.to(torch.bfloat16)
    if rule == "nearest":
        return b
    b = torch.where(b.float() < s, torch.nextafter(b, torch.full_like(b, 1e9)), b)
    for _ in range(int(rule.partition("+")[2] or 0)):
        b = torch.nextafter(b, torch.full_like(b, 1e9))
    return b


def variant(ours: Path, ref: Path, out: Path, rule: str, div: str) -> Path:
    with safe_open(str(ours / "model.safetensors"), "pt") as a, safe_open(str(ref), "pt") as r:
        tensors = {k: a.get_tensor(k) for k in a.keys()}
        for k in [k[: -len(".weight_scale")] for k in tensors if k.endswith(".weight_scale")]:
            w = r.get_tensor(k + ".weight")
            s = scale(w, rule)
            x = w.float() / s.float() if div == "float32" else w / s
            tensors[k + ".weight"], tensors[k + ".weight_scale"] = x.clamp(-448, 448).to(torch.float8_e4m3fn), s
    shutil.rmtree(out, ignore_errors=True)
    shutil.copytree(ours, out, ignore=shutil.ignore_patterns("model.safetensors", "tfcompile"))
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    return out


def sqnr_and_same(art: Path, ref: Path, llmc: Path) -> tuple[float, bool]:
    sig = err = 0.0
    same = True
    with safe_open(str(art / "model.safetensors"), "pt") as f, safe_open(str(ref), "pt") as r, \
            safe_open(str(llmc / "model.safetensors"), "pt") as lc:
        for k in [k[: -len(".weight_scale")] for k in f.keys() if k.endswith(".weight_scale")]:
            w, q, s = r.get_tensor(k + ".weight").float(), f.get_tensor(k + ".weight"), f.get_tensor(k + ".weight_scale")
            sig += float((w ** 2).sum())
            err += float(((w - q.float() * s.float()) ** 2).sum())
            same &= torch.equal(q.view(torch.uint8), lc.get_tensor(k + ".weight").view(torch.uint8)) and \
                torch.equal(s, lc.get_tensor(k + ".weight_scale"))
    return round(10 * math.log10(sig / err), 3), same


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--max-tokens", type=int, default=8192)
    ap.add_argument("--work", type=Path, default=Path("/tmp/tfc-bench-fp8-rounding"))
    ap.add_argument("--llmc-python", default=LLMC_PYTHON)
    args = ap.parse_args()
    from tfcompile.fixtures.smollm2 import smollm2_checkpoint

    model, work = smollm2_checkpoint(), args.work
    work.mkdir(parents=True, exist_ok=True)
    ours, llmc = work / "tfcompile", work / "llm-compressor"
    subprocess.run(["tfcompile", "quantize", str(model), "-o", str(ours), "--format", "fp8-dynamic", "-q",
                    "--overwrite"], check=True)
    subprocess.run([args.llmc_python, str(REPO / "bench" / "peers_llmc.py"), str(model), str(llmc), "--scheme",
                    "FP8_DYNAMIC", "--method", "rtn", "--tokens", str(calib_ids(model, work / "ids.npy"))], check=True)
    ref = model / "model.safetensors"
    arts = {"tfcompile": ours, "llm-compressor": llmc}
    arts.update({name: variant(ours, ref, work / name.replace("/", "-"), *rules) for name, rules in VARIANTS.items()})
    held = HeldOut(model, max_tokens=args.max_tokens, dtype="bfloat16")
    results = {}
    for name, art in arts.items():
        m = held.score_compressed_tensors(art)
        sqnr, same = sqnr_and_same(art, ref, llmc)
        results[name] = {"kl_mean": m["kl_mean"], "perplexity": m["perplexity"], "weight_sqnr_db": sqnr,
                         "bit_identical_to_llm_compressor": same}
        print(name, json.dumps(results[name]), file=sys.stderr, flush=True)
    print(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
