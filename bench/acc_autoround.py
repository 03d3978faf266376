"""tfcompile's learned rounding (`--algorithm signround`) beside auto-round 0.16 itself.

Same model, same calibration ids (tfcompile's `--calib python-doc` tokens, written to a .npy file
auto-round reads), same number of signed-gradient steps and sequences per step, the same held-out
scoring (bench/heldout.py: tfcompile eval's metrics). auto-round runs in its own venv
(/work/venvs/autoround: `pip install auto-round==0.16.0`, never a tfcompile dependency) through
bench/peers_autoround.py; both tools run under `/usr/bin/time -v` for wall time and peak RSS.

    python bench/acc_autoround.py [--model DIR] [--iters 16] [--batch 1] [--samples 16 --seq-len 512]
                                  [--max-tokens 8192] [--schemes nvfp4a16 mxfp4a16] [--write-docs]
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
from common import cpu_busy, replace_doc_section  # noqa: E402
from heldout import ACCURACY_DOC as DOC, HeldOut, Results  # noqa: E402

STORE = Results("autoround-peer")
HEADING = "## Learned rounding beside auto-round"
PYTHON = "/work/venvs/autoround/bin/python"


def timed(argv: list[str]) -> tuple[float, float, str]:
    """(wall seconds, peak RSS in MB, stdout) of `argv` under /usr/bin/time -v, niced."""
    t0 = time.perf_counter()
    res = subprocess.run(["/usr/bin/time", "-v", "nice", "-n", "19", *argv], capture_output=True, text=True)
    seconds = time.perf_counter() - t0
    if res.returncode != 0:
        raise SystemExit(f"failed: {' '.join(argv)}\n{res.stderr[-3000:]}")
    rss = re.search(r"Maximum resident set size \(kbytes\): (\d+)", res.stderr)
    return seconds, int(rss.group(1)) / 1024 if rss else float("nan"), res.stdout


def calib_ids(model: Path, path: Path, samples: int, seq_len: int) -> Path:
    import numpy as np

    from tfcompile.calibration.datasets import calibration_tokens
    from tfcompile.calibration.forward import load_tokenizer

    ids = calibration_tokens("python-doc", load_tokenizer(model), samples=samples, seq_len=seq_len, seed=0)
    np.save(path, ids.numpy())
    return path


def run_scheme(model: Path, scheme: str, args, held: HeldOut, tmp: Path, results: dict) -> None:
    from transformers import AutoModelForCausalLM

    ids = calib_ids(model, tmp / "ids.npy", args.samples, args.seq_len)
    ours, theirs = tmp / f"tfc-{scheme}", tmp / f"ar-{scheme}"
    busy = cpu_busy(0.5)
    s, rss, _ = timed(["tfcompile", "quantize", str(model), "-o", str(ours), "--format", scheme, "-q", "--json",
                       "--algorithm", "signround", "--calib", "python-doc", "--calib-samples", str(args.samples),
                       "--calib-seq-len", str(args.seq_len), "--set", f"quantize.signround_iters={args.iters}",
                       "--set", f"calibrate.batch={args.batch}"])
    key = f"{model.name}/{scheme}/iters={args.iters},batch={args.batch},calib={args.samples}x{args.seq_len}"
    results[f"{key}/tfcompile"] = {"seconds": round(s, 1), "rss_mb": round(rss), "busy_cores": round(busy, 2),
                                      **held.score_artifact(ours)}
    busy = cpu_busy(0.5)
    s, rss, _ = timed([PYTHON, str(REPO / "bench" / "peers_autoround.py"), str(model), str(theirs), "--scheme",
                       scheme, "--tokens", str(ids), "--iters", str(args.iters), "--batch", str(args.batch)])
    model_dir = next((p.parent for p in theirs.rglob("config.json")), theirs)
    ar = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch_dtype(held.dtype)).eval()
    results[f"{key}/auto-round"] = {"seconds": round(s, 1), "rss_mb": round(rss), "busy_cores": round(busy, 2),
                                       **held.score(ar)}
    STORE.save(results)


def torch_dtype(name: str):
    import torch

    return getattr(torch, name)


def table(results: dict) -> str:
    lines = ["| model | scheme | run | tool | KL (nats/token) | perplexity | change | top-1 agreement | wall s | "
             "peak RSS MB |", "|---|---|---|---|---:|---:|---:|---:|---:|---:|"]
    for name, r in results.items():
        model, scheme, run, tool = name.split("/")
        lines.append(f"| {model} | {scheme} | {run} | {tool} | {r['kl_mean']:.4f} | {r['perplexity']:.3f} | "
                     f"{100 * r['ppl_increase']:+.2f}% | {r['top1_agreement']:.4f} | {r['seconds']:.1f} | "
                     f"{r['rss_mb']} |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", type=Path)
    ap.add_argument("--iters", type=int, default=16)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--samples", type=int, default=16)
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--max-tokens", type=int, default=8192)
    ap.add_argument("--schemes", nargs="+", default=["nvfp4a16", "mxfp4a16"])
    ap.add_argument("--write-docs", action="store_true")
    args = ap.parse_args()
    if args.model is None:
        from tfcompile.fixtures.smollm2 import smollm2_checkpoint

        args.model = smollm2_checkpoint()
    held = HeldOut(args.model, max_tokens=args.max_tokens, dtype="bfloat16")
    results = STORE.load()
    with tempfile.TemporaryDirectory(prefix="tfc-autoround-") as tmp:
        for scheme in args.schemes:
            run_scheme(args.model, scheme, args, held, Path(tmp), results)
    print(json.dumps(results, indent=1))
    if args.write_docs:
        replace_doc_section(HEADING, f"Command: `python bench/acc_autoround.py --model {args.model} --iters "
                            f"{args.iters} --batch {args.batch} --samples {args.samples} --seq-len {args.seq_len} "
                            f"--max-tokens {args.max_tokens} --write-docs` (held-out python-doc text, bf16 scoring; "
                            "auto-round's `fake` export holds the dequantized weights in bf16).\n\n"
                            + table(results), DOC)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
