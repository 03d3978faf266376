"""Accuracy table for the demo LM: format x algorithm -> KL, perplexity change, top-1 agreement.

Every row quantizes examples/demo-lm with `tfcompile quantize` and scores it with `tfcompile eval`
against the bf16 original on the held-out split of the python3.11-doc corpus (never used for
training or calibration). Calibration (static activation scales, GPTQ Hessians) uses the corpus'
calib split. Writes the "## Demo LM: quantization accuracy" section of docs/accuracy.md.

    python bench/accuracy.py [--max-tokens 16384] [--write-docs]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))
from common import replace_doc_section  # noqa: E402

MODEL = REPO / "examples" / "demo-lm"
FORMATS = ["nvfp4", "nvfp4a16", "mxfp4", "mxfp4a16", "mxfp8", "fp8", "fp8-dynamic", "fp8-block"]
ALGOS = {"nvfp4": ["rtn", "mse", "gptq"], "nvfp4a16": ["rtn", "mse", "gptq"],
         "mxfp4": ["rtn", "mse", "gptq"], "mxfp4a16": ["rtn", "mse", "gptq"]}
CALIB = ["--calib", "python-doc", "--calib-samples", "64", "--calib-seq-len", "256"]
HEADING = "## Demo LM: quantization accuracy"


def run(argv: list[str]) -> dict:
    res = subprocess.run(argv, capture_output=True, text=True)
    if res.returncode != 0:
        raise SystemExit(f"failed: {' '.join(argv)}\n{res.stderr[-2000:]}")
    return json.loads(res.stdout)


def row(fmt: str, algo: str, work: Path, max_tokens: int) -> dict:
    out = work / f"{fmt}-{algo}"
    needs_calib = algo == "gptq" or fmt in ("nvfp4", "fp8")
    t0 = time.perf_counter()
    run(["tfcompile", "quantize", str(MODEL), "-o", str(out), "--format", fmt, "--algorithm", algo,
         "--json", "-q", *(CALIB if needs_calib else [])])
    seconds = time.perf_counter() - t0
    ev = run(["tfcompile", "eval", str(out), "--reference", str(MODEL), "--max-tokens", str(max_tokens),
              "--json", "-q", "--no-layers"])
    m = ev["metrics"]
    return {"format": fmt, "algorithm": algo, "kl": m["kl_mean"],
            "ppl": m["perplexity"], "ref_ppl": m["reference_perplexity"], "ppl_increase": m["ppl_increase"],
            "top1": m["top1_agreement"], "quantize_s": seconds, "tokens": m["tokens"]}


def table(rows: list[dict]) -> str:
    lines = ["| format | algorithm | KL (nats/token) | perplexity | change | top-1 agreement | quantize s |",
             "|---|---|---:|---:|---:|---:|---:|"]
    ref = rows[0]["ref_ppl"]
    lines.append(f"| bf16 (reference) | - | 0 | {ref:.3f} | 0 | 1 | - |")
    for r in rows:
        lines.append(f"| {r['format']} | {r['algorithm']} | {r['kl']:.5f} | {r['ppl']:.3f} | "
                     f"{100 * r['ppl_increase']:+.2f}% | {r['top1']:.4f} | {r['quantize_s']:.1f} |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--max-tokens", type=int, default=16384)
    ap.add_argument("--write-docs", action="store_true")
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="tfc-acc-") as tmp:
        for fmt in FORMATS:
            for algo in ALGOS.get(fmt, ["rtn"]):
                rows.append(row(fmt, algo, Path(tmp), args.max_tokens))
                print(f"{fmt:12s} {algo:5s} kl={rows[-1]['kl']:.5f} top1={rows[-1]['top1']:.4f}", file=sys.stderr)
    body = (f"Command: `python bench/accuracy.py --max-tokens {args.max_tokens} --write-docs`. Model: "
            f"examples/demo-lm (bf16). Text: held-out split of the python3.11-doc corpus, "
            f"{rows[0]['tokens']} tokens; calibration: 64 x 256 tokens of the calib split. KL is "
            f"KL(reference || quantized) of the next-token distribution; activations are quantized as "
            f"each format does at inference (tfcompile eval's emulation).\n\n" + table(rows) + "\n")
    print(table(rows))
    if args.write_docs:
        replace_doc_section(HEADING, body, REPO / "docs" / "accuracy.md")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
