"""Perplexity cost of the FP8 KV cache on the demo LM: weights x KV-cache strategy.

For each weight format (bf16 — every Linear left unquantized with `--ignore 're:.*'` —,
fp8-dynamic and nvfp4) the demo LM is quantized without a quantized KV cache and with
`--kv-cache fp8` (per tensor) and `--kv-cache fp8 --kv-per-head`, calibrating on the
python3.11-doc calib split as bench/accuracy.py does, and each artifact is scored with
`tfcompile eval` against the bf16 original on the held-out split. `tfcompile eval`
emulates the FP8 KV cache (post-RoPE K and V through E4M3 with the artifact's
k_scale/v_scale before attention), so the KV cost is the perplexity of the KV artifact
relative to the same weights with a bf16 KV cache. As a check, the per-tensor KV artifact
is also evaluated with `--kv-cache off`, which must reproduce the baseline perplexity.

    python bench/acc_kv.py [--max-tokens 65536] [--write-docs]

`kv_rows(work_dir, max_tokens)` and `markdown(rows)` are what bench/accuracy.py calls;
`--write-docs` writes the "## Demo LM: FP8 KV cache" section of docs/accuracy.md.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
from common import EVAL_TOKENS, replace_doc_section  # noqa: E402

MODEL = REPO / "examples" / "demo-lm"
CALIB = ["--calib", "python-doc", "--calib-samples", "64", "--calib-seq-len", "256"]
HEADING = "## Demo LM: FP8 and NVFP4 KV cache"
TARGET = 0.01  # issue #4: the FP8 KV cache adds under 1% relative perplexity
# weights label -> quantize options (bf16: a format whose every Linear is ignored)
WEIGHTS = {"bf16": ["--format", "fp8-dynamic", "--ignore", "re:.*"],
           "fp8-dynamic": ["--format", "fp8-dynamic"],
           "nvfp4": ["--format", "nvfp4"]}
KV = {"fp8 per tensor": ["--kv-cache", "fp8"], "fp8 per head": ["--kv-cache", "fp8", "--kv-per-head"],
      "nvfp4": ["--kv-cache", "nvfp4"]}


def _run(argv: list[str], ok_codes=(0,)) -> dict:
    res = subprocess.run(argv, capture_output=True, text=True)
    if res.returncode not in ok_codes:
        raise SystemExit(f"failed: {' '.join(argv)}\n{res.stderr[-2000:]}")
    return json.loads(res.stdout)


def _quantize(out: Path, weights: str, kv: list[str]) -> None:
    calib = CALIB if kv or weights == "nvfp4" else []  # calibrate runs only for static scales / KV
    _run(["tfcompile", "quantize", str(MODEL), "-o", str(out), *WEIGHTS[weights], *kv, *calib,
          "--overwrite", "--json", "-q"])


def _eval(art: Path, max_tokens: int, kv_mode: str = "auto") -> dict:
    ev = _run(["tfcompile", "eval", str(art), "--reference", str(MODEL), "--max-tokens", str(max_tokens),
               "--kv-cache", kv_mode, "--json", "-q", "--no-layers"])
    m = ev["metrics"]
    return {"ppl": m["perplexity"], "ref_ppl": m["reference_perplexity"], "kl": m["kl_mean"],
            "top1": m["top1_agreement"], "tokens": m["tokens"], "kv_cache": ev["kv_cache"]}


def _baseline(work: Path, weights: str, max_tokens: int) -> dict | None:
    """The same weights with a bf16 KV cache (None for bf16 weights: that is the reference itself)."""
    if weights == "bf16":
        return None
    out = work / f"{weights}-kv-bf16"
    _quantize(out, weights, [])
    return _eval(out, max_tokens)


def _kv_row(work: Path, weights: str, kv: str, max_tokens: int) -> dict:
    out = work / f"{weights}-kv-{kv.replace(' ', '-')}"
    _quantize(out, weights, KV[kv])
    r = _eval(out, max_tokens)
    if not r["kv_cache"]["emulated"]:
        raise SystemExit(f"{out}: tfcompile eval did not emulate the KV cache: {r['kv_cache']}")
    if kv == "fp8 per tensor":  # a check: the same artifact without the emulation is the baseline
        r["off_ppl"] = _eval(out, max_tokens, "off")["ppl"]
    return {"weights": weights, "kv": kv, **r}


def kv_rows(work_dir: Path, max_tokens: int = EVAL_TOKENS) -> list[dict]:
    """One row per weights x KV cache (bf16 KV first): perplexity, KL and top-1 against the bf16
    reference, and `kv_ppl_change` = ppl / ppl(same weights, bf16 KV cache) - 1."""
    rows = []
    for weights in WEIGHTS:
        base = _baseline(Path(work_dir), weights, max_tokens)
        kv = [_kv_row(Path(work_dir), weights, name, max_tokens) for name in KV]
        ref_ppl = kv[0]["ref_ppl"]
        base = base or {"ppl": ref_ppl, "kl": 0.0, "top1": 1.0, "tokens": kv[0]["tokens"]}
        rows.append({"weights": weights, "kv": "bf16", "ppl": base["ppl"], "ref_ppl": ref_ppl,
                     "kl": base["kl"], "top1": base["top1"], "tokens": base["tokens"], "kv_ppl_change": 0.0})
        for r in kv:
            r.pop("kv_cache")
            rows.append(dict(r, base_ppl=base["ppl"], kv_ppl_change=r["ppl"] / base["ppl"] - 1.0))
        print(f"{weights}: " + ", ".join(f"{r['kv']} {r['ppl']:.3f}" for r in rows if r["weights"] == weights),
              file=sys.stderr)
    return rows


def markdown(rows: list[dict]) -> str:
    """The table: weights, KV cache, perplexity, change vs the bf16 reference and vs a bf16 KV cache."""
    lines = ["| weights | KV cache | perplexity | vs bf16 reference | KV cost (vs bf16 KV) | "
             "KL (nats/token) | top-1 agreement |",
             "|---|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        cost = "-" if r["kv"] == "bf16" else f"{100 * r['kv_ppl_change']:+.3f}%"
        lines.append(f"| {r['weights']} | {r['kv']} | {r['ppl']:.3f} | {100 * (r['ppl'] / r['ref_ppl'] - 1):+.2f}% | "
                     f"{cost} | {r['kl']:.5f} | {r['top1']:.4f} |")
    return "\n".join(lines)


def _off_check(rows: list[dict]) -> str:
    checks = [abs(r["off_ppl"] / r["base_ppl"] - 1) for r in rows if "off_ppl" in r]
    if all(c < 1e-9 for c in checks):
        return ("`tfcompile eval --kv-cache off` on the per-tensor KV artifacts reproduces the "
                "baseline perplexity exactly (same weights; only the KV cache differs).")
    return f"warning: `--kv-cache off` differs from the baseline by up to {max(checks):.2e} (relative)."


def doc_body(rows: list[dict], max_tokens: int) -> str:
    worst = max(abs(r["kv_ppl_change"]) for r in rows if r["kv"].startswith("fp8"))
    nv = [r["kv_ppl_change"] for r in rows if r["kv"] == "nvfp4"]
    verdict = "meets" if worst < TARGET else "misses"
    base_kl = {r["weights"]: r["kl"] for r in rows if r["kv"] == "bf16"}
    dkl = [r["kl"] - base_kl[r["weights"]] for r in rows if r["kv"] != "bf16"]
    return (f"Command: `python bench/acc_kv.py --max-tokens {max_tokens} --write-docs`. Model: examples/demo-lm "
            f"(bf16, 4 layers, 2 KV heads of 64). Text: held-out split of the python3.11-doc corpus, "
            f"{rows[0]['tokens']} tokens; calibration (KV amax, nvfp4 activation scales): 64 x 256 tokens of "
            f"the calib split. `tfcompile eval` emulates the FP8 E4M3 KV cache: every attention call "
            f"gets K and V (post-RoPE) as `e4m3(clamp(x / scale, ±448)) * scale` with the artifact's "
            f"k_scale/v_scale, per tensor or per KV head; the NVFP4 KV cache (`--kv-cache nvfp4`) as E2M1 in "
            f"blocks of 16 along head_dim with E4M3 block scales and the global dequant multiplier "
            f"k_scale / 6. bf16 weights = every Linear left unquantized "
            f"(`--ignore 're:.*'`), so that row is the KV cache alone. The KV cost column is the "
            f"perplexity relative to the same weights with a bf16 KV cache.\n\n" + markdown(rows) +
            f"\n\nLargest FP8 KV cost: {100 * worst:.3f}% — {verdict} the issue #4 target of < 1%. "
            f"Perplexity moves of a few tenths of a percent either way are within what any small "
            f"perturbation does on {rows[0]['tokens']} tokens (signed changes partly cancel); KL to the "
            f"reference does not cancel, and the FP8 KV cache adds {min(dkl):.5f} to {max(dkl):.5f} "
            f"nats/token to it. NVFP4 KV costs {100 * min(nv):+.2f}% to {100 * max(nv):+.2f}% perplexity "
            f"beside it. " + _off_check(rows) + "\n")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--max-tokens", type=int, default=EVAL_TOKENS)
    ap.add_argument("--write-docs", action="store_true")
    ap.add_argument("--rows-json", type=Path, help="Also save the rows as JSON here.")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="tfc-acc-kv-") as tmp:
        rows = kv_rows(Path(tmp), args.max_tokens)
    if args.rows_json:
        args.rows_json.write_text(json.dumps(rows, indent=2) + "\n")
    print(markdown(rows))
    if args.write_docs:
        replace_doc_section(HEADING, doc_body(rows, args.max_tokens), REPO / "docs" / "accuracy.md")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
