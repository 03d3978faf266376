"""Do the distilled SmolLM2 artifacts' perplexity gains carry beyond the 8,192 held-out tokens?

docs/accuracy.md's distillation table scores every row on the first 8,192 tokens of python-doc's
held-out split. Some rows there have a lower perplexity at a higher KL than others (from RTN's
start, or with a cross-entropy term), and 8,192 tokens is a small sample. This study scores the
artifacts bench/acc_distill_smollm2.py left in its --work folder on two other texts, neither ever
trained on:

- `heldout-next`: the held-out split's tokens after the table's first 8,192 (the same kind of text,
  an independent sample of it);
- `stdlib`: Python source code, the standard library's own top-level modules in name order
  (another kind of text: the training data is documentation prose with examples).

Every figure is tfcompile eval's (`LogitMetrics` against the bf16 checkpoint, rows of 256 tokens,
the artifact built as `tfcompile eval` builds it, bfloat16).

    python -m bench.studies.distill_other_text --work DIR [--rows ROW ...] [--tokens 16384]

prints one JSON object per (text, row) on stdout and a markdown table on stderr.

    python -m bench.studies.distill_other_text --changed START DISTILLED

prints the share of FP4 codes and of block scales that differ between two artifacts of one format
(e.g. RTN's and the distillation from RTN's start), and the other tensors that differ.
Measured 2026-12-06: docs/accuracy.md "SmolLM2: distillation on other text".
"""

from __future__ import annotations

import argparse
import json
import sys
import sysconfig
import tempfile
from pathlib import Path

import torch

from bench.heldout import HeldOut

SKIP = 8192  # the distillation table's held-out tokens (bench/acc_distill_smollm2.py --max-tokens default)
ROWS = ["nvfp4a16/rtn", "nvfp4a16/gptq-fos", "nvfp4a16/distill-gptq-fos", "nvfp4a16/distill-rtn",
        "nvfp4a16/distill-gptq-fos-ce", "mxfp4a16/rtn", "mxfp4a16/gptq", "mxfp4a16/distill-gptq",
        "mxfp4a16/distill-rtn", "mxfp4a16/distill-gptq-ce"]


def stdlib_source(chars: int) -> str:
    """The standard library's top-level modules (sorted by name), whole, concatenated up to `chars`.
    Code, not tfcompile.calibration.stdlib_text's docstrings: those are python-doc's kind of prose."""
    parts, n = [], 0
    for f in sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py")):
        parts.append(f.read_text(encoding="utf-8", errors="replace"))
        n += len(parts[-1])
        if n >= chars:
            break
    return "\n\n".join(parts)


def held_out(kind: str, smol: Path, tokens: int, tmp: Path) -> HeldOut:
    """`tokens` tokens of text `kind` and the bf16 reference's log-probabilities on them."""
    if kind == "heldout-next":  # python-doc's held-out split after the table's first SKIP tokens
        held = HeldOut(smol, max_tokens=tokens, dtype="bfloat16", skip=SKIP)
    elif kind == "stdlib":
        text = tmp / "stdlib.py.txt"
        text.write_text(stdlib_source(tokens * 8), encoding="utf-8")
        held = HeldOut(smol, max_tokens=tokens, dtype="bfloat16", text=text)
    else:
        raise SystemExit(f"unknown text {kind!r}; hint: heldout-next or stdlib")
    if held.tokens < tokens:
        raise SystemExit(f"text {kind} gives {held.tokens} tokens, fewer than --tokens {tokens}")
    return held


def changed(a: Path, b: Path) -> dict:
    """Share of 4-bit codes (two per byte of *.weight_packed) and of block scales (*.weight_scale,
    compared as bytes) that differ between artifacts a and b; the names of other differing tensors."""
    from safetensors.torch import load_file

    ta, tb = load_file(str(a / "model.safetensors")), load_file(str(b / "model.safetensors"))
    codes = scales = n_codes = n_scales = 0
    other = []
    for k, x in ta.items():
        y = tb[k]
        if k.endswith("weight_packed"):  # uint8, two E2M1 codes per byte
            codes += int(((x & 15) != (y & 15)).sum() + ((x >> 4) != (y >> 4)).sum())
            n_codes += 2 * x.numel()
        elif k.endswith("weight_scale"):
            scales += int((x.view(torch.uint8) != y.view(torch.uint8)).sum())
            n_scales += x.numel()
        elif not torch.equal(x, y):
            other.append(k)
    return {"codes_changed": codes / n_codes, "scales_changed": scales / n_scales, "other_changed": other}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", type=Path, help="bench/acc_distill_smollm2.py's --work folder")
    ap.add_argument("--rows", nargs="+", default=ROWS)
    ap.add_argument("--texts", nargs="+", default=["heldout-next", "stdlib"])
    ap.add_argument("--tokens", type=int, default=16384)
    ap.add_argument("--changed", nargs=2, type=Path, metavar=("START", "DISTILLED"))
    args = ap.parse_args()
    if args.changed:
        print(json.dumps(changed(*args.changed)))
        return 0
    if args.work is None:
        ap.error("--work is required (hint: bench/acc_distill_smollm2.py's --work folder)")
    from tfcompile.fixtures.smollm2 import smollm2_checkpoint

    torch.set_num_threads(2)
    smol, out = smollm2_checkpoint(), []
    with tempfile.TemporaryDirectory(prefix="tfc-other-text-") as tmp:
        for kind in args.texts:
            held = held_out(kind, smol, args.tokens, Path(tmp))
            for row in args.rows:
                r = {"text": kind, "row": row, **held.score_artifact(args.work / row.replace("/", "-"))}
                print(json.dumps(r), flush=True)
                out.append(r)
            del held  # its reference log-probabilities: tokens x vocab x 4 bytes
    print(table(out), file=sys.stderr)
    return 0


def table(out: list[dict]) -> str:
    """The docs' table; recovered: 1 - increase / (the same format's RTN row's increase on that text)."""
    rtn = {(r["text"], r["row"].split("/")[0]): r["ppl_increase"] for r in out
           if r["row"].endswith(("/rtn", "/rtn-max"))}  # W4A4 NVFP4: max-based RTN, as the distill table
    lines = ["| text | row | KL | perplexity (bf16's) | change | RTN's increase recovered | top-1 agreement |",
             "|---|---|---:|---:|---:|---:|---:|"]
    for r in out:
        base = rtn.get((r["text"], r["row"].split("/")[0]))
        rec = f"{100 * (1 - r['ppl_increase'] / base):.0f}%" if base else "-"
        lines.append(f"| {r['text']} | `{r['row']}` | {r['kl_mean']:.4f} | {r['perplexity']:.3f} "
                     f"({r['reference_perplexity']:.3f}) | {100 * r['ppl_increase']:+.2f}% | {rec} | "
                     f"{r['top1_agreement']:.4f} |")
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
