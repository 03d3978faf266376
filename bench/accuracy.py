"""Accuracy table for the demo LM: format x algorithm -> KL, perplexity change, top-1 agreement.

Every row quantizes examples/demo-lm with `tfcompile quantize` and scores it with `tfcompile eval`
against the bf16 original on the held-out split of the python3.11-doc corpus (never used for
training or calibration). Calibration (static activation scales, GPTQ Hessians, AWQ statistics)
uses the corpus' calib split. Writes the "## Demo LM: quantization accuracy" section of
docs/accuracy.md.

    python bench/accuracy.py [--max-tokens 65536] [--write-docs] [--only ALGO ...] [--all]

`--all` then runs the scripts of the other sections (MiniLM cosine, activation observers, FP8 KV
cache, distillation), so `python bench/accuracy.py --all --write-docs` regenerates all of
docs/accuracy.md's measured sections.

`--only awq` measures only that method's rows and keeps every other row (and the bf16
reference row) from the table already in docs/accuracy.md; without it every row is measured.
`--model smollm2` runs bench/acc_smollm2.py instead (SmolLM2-135M-Instruct, the real LLM);
bench/peers.py (llm-compressor and modelopt side by side) needs llm-compressor's own venv and is
run on its own.
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
from common import EVAL_TOKENS, replace_doc_section  # noqa: E402

MODEL = REPO / "examples" / "demo-lm"
DOC = REPO / "docs" / "accuracy.md"
FORMATS = ["nvfp4", "nvfp4a16", "mxfp4", "mxfp4a16", "mxfp8", "fp8", "fp8-dynamic", "fp8-block"]
FOUR_BIT = ["rtn", "mse", "gptq", "awq", "rotate", "rotate+gptq"]
NVFP4 = FOUR_BIT + ["4/6", "gptq+4/6"]
ALGOS = {"nvfp4": NVFP4 + ["smoothquant"], "nvfp4a16": NVFP4, "mxfp4": FOUR_BIT, "mxfp4a16": FOUR_BIT,
         "fp8": ["rtn", "smoothquant"]}
# method -> its tfcompile quantize arguments (docs/cli.md)
FOS = ["--set", "quantize.nvfp4_scales=four_over_six"]
ROT = ["--set", "rotate.kind=hadamard"]
METHODS = {"rtn": [], "mse": ["--algorithm", "mse"], "gptq": ["--algorithm", "gptq"], "awq": ["--algorithm", "awq"],
           "smoothquant": ["--algorithm", "smoothquant"], "4/6": FOS, "gptq+4/6": ["--algorithm", "gptq", *FOS],
           "rotate": ROT, "rotate+gptq": [*ROT, "--algorithm", "gptq"]}
NEEDS_CALIB = ("gptq", "awq", "smoothquant")  # methods whose arguments add the calibrate pass
CALIB = ["--calib", "python-doc", "--calib-samples", "64", "--calib-seq-len", "256"]
HEADING = "## Demo LM: quantization accuracy"
HEADER = ["| format | method | KL (nats/token) | perplexity | change | top-1 agreement | quantize s |",
          "|---|---|---:|---:|---:|---:|---:|"]


def run(argv: list[str]) -> dict:
    res = subprocess.run(argv, capture_output=True, text=True)
    if res.returncode != 0:
        raise SystemExit(f"failed: {' '.join(argv)}\n{res.stderr[-2000:]}")
    return json.loads(res.stdout)


def measure(fmt: str, algo: str, work: Path, max_tokens: int) -> dict:
    out = work / f"{fmt}-{algo.replace('/', '')}"
    args = METHODS[algo]
    needs_calib = any(a in NEEDS_CALIB for a in args) or fmt in ("nvfp4", "fp8")
    t0 = time.perf_counter()
    run(["tfcompile", "quantize", str(MODEL), "-o", str(out), "--format", fmt, *args,
         "--json", "-q", *(CALIB if needs_calib else [])])
    seconds = time.perf_counter() - t0
    ev = run(["tfcompile", "eval", str(out), "--reference", str(MODEL), "--max-tokens", str(max_tokens),
              "--json", "-q", "--no-layers"])
    m = ev["metrics"]
    return {"format": fmt, "algorithm": algo, "kl": m["kl_mean"],
            "ppl": m["perplexity"], "ref_ppl": m["reference_perplexity"], "ppl_increase": m["ppl_increase"],
            "top1": m["top1_agreement"], "quantize_s": seconds, "tokens": m["tokens"]}


def cells(r: dict) -> list[str]:
    """A measured row as the table's cells (format, algorithm, KL, ppl, change, top-1, seconds)."""
    return [r["format"], r["algorithm"], f"{r['kl']:.5f}", f"{r['ppl']:.3f}",
            f"{100 * r['ppl_increase']:+.2f}%", f"{r['top1']:.4f}", f"{r['quantize_s']:.1f}"]


def ref_cells(ref_ppl: float) -> list[str]:
    return ["bf16 (reference)", "-", "0", f"{ref_ppl:.3f}", "0", "1", "-"]


def parse_table(text: str) -> tuple[list[str] | None, dict[tuple[str, str], list[str]]]:
    """(reference row cells, (format, algorithm) -> cells) of the section's table in `text`."""
    start = text.find(HEADING)
    section = text[start:].split("\n## ", 1)[0] if start >= 0 else ""
    ref, rows = None, {}
    for line in section.splitlines():
        if not line.startswith("| ") or line.startswith(("| format", "|---")):
            continue
        c = [x.strip() for x in line.strip().strip("|").split("|")]
        if c[0] == "bf16 (reference)":
            ref = c
        elif len(c) == len(HEADER[0].strip("|").split("|")):
            rows[(c[0], c[1])] = c
    return ref, rows


def table(ref: list[str], rows: dict[tuple[str, str], list[str]]) -> str:
    keys = [(f, a) for f in FORMATS for a in ALGOS.get(f, ["rtn"])]
    lines = HEADER + ["| " + " | ".join(ref) + " |"]
    lines += ["| " + " | ".join(rows[k]) + " |" for k in keys if k in rows]
    return "\n".join(lines)


def awq_summary(rows: dict[tuple[str, str], list[str]]) -> str:
    """One sentence: AWQ's KL against RTN's, per format that has both rows."""
    parts = []
    for f in FORMATS:
        if (f, "awq") in rows and (f, "rtn") in rows:
            a, r = float(rows[(f, "awq")][2]), float(rows[(f, "rtn")][2])
            parts.append(f"{f} {r:.5f} -> {a:.5f} ({100 * (a / r - 1):+.0f}%)")
    return ("AWQ vs RTN, KL: " + "; ".join(parts) + ".") if parts else ""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--max-tokens", type=int, default=EVAL_TOKENS)
    ap.add_argument("--write-docs", action="store_true")
    ap.add_argument("--only", nargs="+", metavar="ALGO", help="measure only these algorithms' rows; "
                    "keep the others from docs/accuracy.md")
    ap.add_argument("--all", action="store_true", help="then regenerate every other section of "
                    "docs/accuracy.md too: " + ", ".join(COMPANIONS))
    ap.add_argument("--model", choices=["demo-lm", "smollm2"], default="demo-lm",
                    help="smollm2: the SmolLM2-135M-Instruct tables instead (bench/acc_smollm2.py; its options "
                         "after --)")
    args, rest = ap.parse_known_args()
    if args.model == "smollm2":
        argv = [sys.executable, str(REPO / "bench" / "acc_smollm2.py"), *rest]
        argv += ["--write-docs"] if args.write_docs else []
        return subprocess.run(argv).returncode
    if rest:
        ap.error(f"unrecognized arguments: {' '.join(rest)}")
    if args.all:
        _main_table(args)
        return run_companions(args.max_tokens, args.write_docs)
    return _main_table(args)


# The other sections of docs/accuracy.md, each written by its own script; `--all` runs them in order.
COMPANIONS = {"minilm.py": [], "acc_observers.py": ["--max-tokens"], "acc_kv.py": ["--max-tokens"],
              "acc_distill.py": ["--max-tokens"], "acc_smollm2.py": [], "acc_mixed.py": []}


def run_companions(max_tokens: int, write_docs: bool) -> int:
    for script, opts in COMPANIONS.items():
        argv = [sys.executable, str(REPO / "bench" / script)]
        if "--max-tokens" in opts:
            argv += ["--max-tokens", str(max_tokens)]
        if write_docs:
            argv.append("--write-docs")
        print(f"== {' '.join(argv[1:])}", file=sys.stderr)
        if subprocess.run(argv).returncode != 0:
            raise SystemExit(f"failed: {' '.join(argv)}")
    return 0


def _main_table(args) -> int:
    old_ref, rows = parse_table(DOC.read_text()) if args.only else (None, {})
    if args.only and old_ref is None:
        raise SystemExit("--only needs the existing table in docs/accuracy.md; run without --only first")
    measured = []
    with tempfile.TemporaryDirectory(prefix="tfc-acc-") as tmp:
        for fmt in FORMATS:
            for algo in ALGOS.get(fmt, ["rtn"]):
                if args.only and algo not in args.only:
                    continue
                r = measure(fmt, algo, Path(tmp), args.max_tokens)
                measured.append(r)
                rows[(fmt, algo)] = cells(r)
                print(f"{fmt:12s} {algo:5s} kl={r['kl']:.5f} top1={r['top1']:.4f}", file=sys.stderr)
    ref = old_ref or ref_cells(measured[0]["ref_ppl"])
    if measured and f"{measured[0]['ref_ppl']:.3f}" != ref[3]:
        raise SystemExit(f"reference perplexity {measured[0]['ref_ppl']:.3f} differs from the table's "
                         f"{ref[3]}: the model or text changed; rerun without --only")
    body = (f"Command: `python bench/accuracy.py --max-tokens {args.max_tokens} --write-docs` (add "
            f"`--only awq` to remeasure one algorithm's rows and keep the rest). Model: "
            f"examples/demo-lm (bf16). Text: held-out split of the python3.11-doc corpus, "
            f"{measured[0]['tokens'] if measured else args.max_tokens} tokens; calibration: 64 x 256 "
            f"tokens of the calib split. KL is KL(reference || quantized) of the next-token "
            f"distribution; activations are quantized as each format does at inference (tfcompile "
            f"eval's emulation); change is the perplexity change against the bf16 reference.\n\n"
            + table(ref, rows) + "\n\n" + awq_summary(rows) + "\n")
    print(table(ref, rows))
    if args.write_docs:
        replace_doc_section(HEADING, body, DOC)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
