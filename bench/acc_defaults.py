"""Defaults on evidence across models (issue 33): GPTQ and calibrated RTN settings, tfcompile and
llm-compressor side by side, as a mean and spread over calibration draws.

For one model (`--model demo-lm | demo-gemma | smollm2 | PATH`), every row is a whole
`tfcompile quantize` run (or llm-compressor's `oneshot` in its own venv, bench/peers_llmc.py)
on 16 x 128 tokens of the python-doc calibration split, drawn with `--calib-seed` 0, 1, 2 (the
same ids are written to a .npy file for llm-compressor, as bench/peers.py does). Each artifact is
loaded the same way for both tools, by transformers + compressed-tensors in bf16 (weights
decompressed; W4A4 inputs fake-quantized by compressed-tensors), and scored by bench/heldout.py
against the bf16 model on the first `--max-tokens` held-out tokens.

Variants (VARIANTS): RTN with max-based scales (data-free for nvfp4a16: one run, no draw; W4A4 with
`quantize.scale_search=none`, since its default searches them), scales by output error
(`quantize.scale_search=output`: W4A4 RTN's default), calibrated RTN with its static input scales observed through the
quantized layers (`calibrate.propagate=true`: W4A4 only; weight-only RTN calibrates nothing), GPTQ with tfcompile's defaults (act-order, dampening 0.01,
Hessians from the unquantized model), with propagation (`calibrate.propagate=true`), dampening
0.001, without act-order, with scales by RTN's output error, with scales scored after the GPTQ solve
(`quantize.scale_search=gptq`; not with propagation: refused), with the Hessian computed and summed
in the forwards' dtype (`calibrate.hessian_dtype=compute`: bf16 on a CPU with native bf16);
llm-compressor's RTN and GPTQ (its
defaults: block 128, dampening 0.01, static act-order, sequential pipeline = propagation).

    python bench/acc_defaults.py --model demo-gemma [--formats nvfp4a16 nvfp4] [--only VARIANT ...]
    python bench/acc_defaults.py --model demo-gemma --table      # mean / spread from saved runs
    python bench/acc_defaults.py --formats nvfp4a16 nvfp4 --across smollm2:8192 demo-lm:32768 demo-gemma:32768
                                      # each variant against the default, per model and on average

Results: $TFCOMPILE_CACHE/bench/defaults-<model>-<formats>-<tokens>.json (one file per format
list, so two formats can run side by side); the summary table goes to stdout.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path


REPO = Path(__file__).resolve().parents[1]
from common import cpu_busy  # noqa: E402
from heldout import HeldOut, Results, cache_root  # noqa: E402
from peers import calib_ids, timed  # noqa: E402

SAMPLES, SEQ = 16, 128  # the issue's calibration: 16 x 128 tokens
SEEDS = (0, 1, 2)
LLMC_PYTHON = "/work/venvs/llmc/bin/python"
PRESETS = {"nvfp4a16": "NVFP4A16", "nvfp4": "NVFP4", "mxfp4a16": "MXFP4A16"}
# variant -> (tool, algorithm, --set edits)
VARIANTS = {
    "rtn": ("tfcompile", "rtn", []),
    "rtn-output": ("tfcompile", "rtn", ["quantize.scale_search=output"]),
    "rtn-prop": ("tfcompile", "rtn", ["calibrate.propagate=true"]),
    "gptq": ("tfcompile", "gptq", []),
    "gptq-prop": ("tfcompile", "gptq", ["calibrate.propagate=true"]),
    "gptq-damp0.001": ("tfcompile", "gptq", ["quantize.gptq_damp=0.001"]),
    "gptq-noact": ("tfcompile", "gptq", ["quantize.gptq_act_order=false"]),
    "gptq-output": ("tfcompile", "gptq", ["quantize.scale_search=output"]),
    "gptq-solved": ("tfcompile", "gptq", ["quantize.scale_search=gptq"]),
    "gptq-hcompute": ("tfcompile", "gptq", ["calibrate.hessian_dtype=compute"]),
    "llmc-rtn": ("llm-compressor", "rtn", []),
    "llmc-gptq": ("llm-compressor", "gptq", []),
}
# (rtn baseline, gptq-like variants scored against it) per tool, for the "recovered" column
BASELINE = {"tfcompile": "rtn", "llm-compressor": "llmc-rtn"}


def model_path(name: str) -> Path:
    if name == "smollm2":
        from tfcompile.fixtures.smollm2 import smollm2_checkpoint

        return smollm2_checkpoint()
    p = REPO / "examples" / name
    return p if p.is_dir() else Path(name)


def data_free(fmt: str, variant: str) -> bool:
    """Weight-only RTN calibrates nothing: one run, the same for every draw."""
    return fmt.endswith("a16") and VARIANTS[variant][1] == "rtn" and not VARIANTS[variant][2]


def quantize(model: Path, out: Path, fmt: str, variant: str, seed: int, ids: Path) -> float:
    tool, algorithm, sets = VARIANTS[variant]
    if tool == "llm-compressor":
        argv = [LLMC_PYTHON, str(REPO / "bench" / "peers_llmc.py"), str(model), str(out), "--scheme",
                PRESETS[fmt], "--method", algorithm]
        return timed(argv + ([] if data_free(fmt, variant) else ["--tokens", str(ids)]))
    argv = ["tfcompile", "quantize", str(model), "-o", str(out), "--format", fmt, "-q", "--overwrite",
            "--algorithm", algorithm]
    if not data_free(fmt, variant):
        argv += ["--calib", "python-doc", "--calib-samples", str(SAMPLES), "--calib-seq-len", str(SEQ),
                 "--calib-seed", str(seed)]
    if variant == "rtn" and not data_free(fmt, variant):  # max-based scales (W4A4 RTN's default searches)
        argv += ["--set", "quantize.scale_search=none"]
    for s in sets:
        argv += ["--set", s]
    return timed(argv)


def measure(model: Path, held: HeldOut, fmts: list[str], variants: list[str], seeds: list[int],
            results: dict, store: Results, rerun: bool = False) -> None:
    """Quantize and score every (format, variant, draw) not in `results` yet (all of them with `rerun`),
    saving after each row, so an interrupted sweep continues where it stopped."""
    with tempfile.TemporaryDirectory(prefix="tfc-defaults-") as tmp:
        for fmt in fmts:
            for variant in variants:
                for seed in ([0] if data_free(fmt, variant) else seeds):
                    key = f"{fmt}/{variant}/{seed}"
                    if key in results and not rerun:
                        continue
                    out = Path(tmp) / key.replace("/", "-")
                    busy = cpu_busy(0.5)
                    try:
                        seconds = quantize(model, out, fmt, variant, seed, calib_ids(model, Path(tmp) / "ids.npy", seed=seed, samples=SAMPLES, seq_len=SEQ))
                    except SystemExit as e:  # a finding too (a bf16 Hessian that is not positive definite)
                        lines = [x for x in str(e).splitlines() if x.startswith("error:")] or str(e).splitlines()[-1:]
                        results[key] = {"error": lines[0][:300]}
                        print(f"{key:32s} failed: {results[key]['error']}", file=sys.stderr, flush=True)
                        store.save(results)
                        continue
                    r = held.score_compressed_tensors(out)
                    results[key] = {"quantize_s": seconds, "busy_cores": round(busy, 2),
                                    **{k: r[k] for k in ("kl_mean", "perplexity", "reference_perplexity",
                                                         "ppl_increase", "top1_agreement")}}
                    print(f"{key:32s} ppl {r['perplexity']:.3f} ({100 * r['ppl_increase']:+.2f}%) "
                          f"KL {r['kl_mean']:.5f} [{seconds} s]", file=sys.stderr, flush=True)
                    store.save(results)
                    subprocess.run(["rm", "-rf", str(out)])


def stats(results: dict, fmt: str, variant: str) -> dict | None:
    """Mean, min and max of the perplexity and of the KL over the draws measured, and their count."""
    rows = [r for k, r in results.items() if k.startswith(f"{fmt}/{variant}/") and "error" not in r]
    if not rows:
        return None
    ppl, kl = [r["perplexity"] for r in rows], [r["kl_mean"] for r in rows]
    return {"mean": statistics.fmean(ppl), "min": min(ppl), "max": max(ppl), "n": len(ppl),
            "kl": statistics.fmean(kl), "kl_min": min(kl), "kl_max": max(kl),
            "ref": rows[0]["reference_perplexity"]}


def table(results: dict, fmts: list[str]) -> str:
    """Per format and variant: perplexity mean [min, max] over draws, change vs bf16, the share of the
    same tool's RTN increase recovered ((RTN - x) / (RTN - bf16), RTN's mean over its draws; "-" where
    RTN is not above bf16), the KL mean [min, max] and the share of the tool's RTN KL removed."""
    lines = ["| format | variant | tool | draws | perplexity mean [min, max] | vs bf16 | RTN's increase recovered "
             "| KL mean [min, max] | RTN's KL removed |", "|---|---|---|---:|---:|---:|---:|---:|---:|"]
    for fmt in fmts:
        for variant, (tool, _, _) in VARIANTS.items():
            s = stats(results, fmt, variant)
            failed = sum(1 for k, r in results.items() if k.startswith(f"{fmt}/{variant}/") and "error" in r)
            if failed:
                lines.append(f"| {fmt} | {variant} | {tool} | {failed} failed | - | - | - | - | - |")
            if s is None:
                continue
            base = stats(results, fmt, BASELINE[tool])
            rec = kl_rec = "-"
            if base and variant != BASELINE[tool] and base["mean"] > s["ref"]:
                rec = f"{100 * (base['mean'] - s['mean']) / (base['mean'] - s['ref']):.0f}%"
            if base and variant != BASELINE[tool]:
                kl_rec = f"{100 * (1 - s['kl'] / base['kl']):.0f}%"
            lines.append(f"| {fmt} | {variant} | {tool} | {s['n']} | {s['mean']:.3f} [{s['min']:.3f}, "
                         f"{s['max']:.3f}] | {100 * (s['mean'] / s['ref'] - 1):+.2f}% | {rec} | {s['kl']:.4f} "
                         f"[{s['kl_min']:.4f}, {s['kl_max']:.4f}] | {kl_rec} |")
    return "\n".join(lines)


def saved(model: str, tokens: int) -> dict:
    """Every saved row of one model scored on `tokens` held-out tokens, over all format lists and
    tags (keys "format/variant/seed" are the same run wherever they were saved)."""
    out: dict = {}
    for f in sorted((cache_root() / "bench").glob(f"defaults-{model}-*-{tokens}*.json")):
        out.update(json.loads(f.read_text()))
    return out


def across(models: list[str], fmts: list[str]) -> str:
    """Per format and tfcompile variant, on each model (MODEL:TOKENS): the change of the mean KL and
    of the mean perplexity against tfcompile's default of the same kind (GPTQ variants against
    `gptq`, RTN variants against `rtn`), and the average of each change over the models that have
    both; llm-compressor's rows against the same default, for the tool comparison. Negative: better."""
    runs = {m: saved(*m.split(":")[:1], int(m.split(":")[1])) for m in models}
    head = " | ".join(f"{m.split(':')[0]} KL / ppl" for m in models)
    lines = [f"| format | variant | {head} | mean KL / ppl change |", "|---|---|" + "---:|" * (len(models) + 1)]
    for fmt in fmts:
        for variant, (tool, algorithm, _) in VARIANTS.items():
            base = "gptq" if algorithm == "gptq" else "rtn"
            cells, dk, dp = [], [], []
            for m in models:
                s, b = stats(runs[m], fmt, variant), stats(runs[m], fmt, base)
                if s is None or b is None:
                    cells.append("-")
                    continue
                k, q = 100 * (s["kl"] / b["kl"] - 1), 100 * (s["mean"] / b["mean"] - 1)
                cells.append(f"{k:+.1f}% / {q:+.2f}% ({s['n']})" if variant != base else f"{s['kl']:.4f} / {s['mean']:.3f} ({s['n']})")
                dk, dp = dk + [k], dp + [q]
            if any(c != "-" for c in cells):
                avg = "-" if variant == base or not dk else f"{statistics.fmean(dk):+.1f}% / {statistics.fmean(dp):+.2f}% ({len(dk)})"
                lines.append(f"| {fmt} | {variant} | {' | '.join(cells)} | {avg} |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="demo-gemma", help="demo-lm | demo-gemma | smollm2 | a checkpoint dir")
    ap.add_argument("--formats", nargs="+", default=["nvfp4a16"], choices=sorted(PRESETS))
    ap.add_argument("--only", nargs="+", choices=list(VARIANTS), help="variants to run (default all)")
    ap.add_argument("--seeds", nargs="+", type=int, default=list(SEEDS))
    ap.add_argument("--max-tokens", type=int, default=32768, help="held-out tokens scored")
    ap.add_argument("--table", action="store_true", help="only print the table from saved results")
    ap.add_argument("--rerun", action="store_true", help="measure rows already saved again (default: skip them)")
    ap.add_argument("--tag", default="", help="keep these runs in their own results file (runs side by side)")
    ap.add_argument("--merge", nargs="*", default=[], metavar="TAG", help="with --table: add these tags' runs")
    ap.add_argument("--across", nargs="+", metavar="MODEL:TOKENS",
                    help="only print each variant's change against the default on these models' saved runs")
    args = ap.parse_args()
    if args.across:
        print(across(args.across, args.formats))
        return 0
    name = f"defaults-{Path(args.model).name}-{'-'.join(args.formats)}-{args.max_tokens}"
    store = Results(name + (f"-{args.tag}" if args.tag else ""))
    results = store.load()
    for tag in args.merge:
        results.update(Results(f"{name}-{tag}").load())
    if not args.table:
        path = model_path(args.model)
        held = HeldOut(path, max_tokens=args.max_tokens, dtype="bfloat16")
        measure(path, held, args.formats, args.only or list(VARIANTS), args.seeds, results, store, args.rerun)
    print(table(results, args.formats))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
