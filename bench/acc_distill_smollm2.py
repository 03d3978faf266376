"""SmolLM2-135M-Instruct: quantization-aware distillation (`tfcompile distill`) beside RTN and GPTQ.

Every row runs `tfcompile quantize` or `tfcompile distill` in a fresh process (timed) and is scored
as bench/acc_smollm2.py scores its table (bench/heldout.py: the first --max-tokens tokens of the
python3.11-doc held-out split, rows of 256, `tfcompile eval --dtype bfloat16`'s loader and
metrics), so its figures sit beside "SmolLM2-135M-Instruct: quantization accuracy". Distillation
trains on the corpus' train split (distill.data python-doc; never the held-out text); a row with
`--init` starts the student from the weights of an earlier row's artifact (a GPTQ one, or an
earlier distillation for a second stage: built in the same --work folder first;
tfcompile/distill/init.py), and each distill row keeps a --resume-dir there (a killed row resumes
when rerun with the same --work).

    python bench/acc_distill_smollm2.py [--steps 24] [--only ROW ...] [--work DIR] [--write-docs] [--list]

Results are kept in $TFCOMPILE_CACHE/bench/smollm2-distill.json (keyed by row name, with the
machine's CPU and load, the steps, tokens and wall seconds), so `--only` remeasures some rows and keeps
the others; the docs section ("## SmolLM2: quantization-aware distillation") is written from it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
from common import cpu_busy, machine_description, replace_doc_section  # noqa: E402
from heldout import ACCURACY_DOC as DOC, CALIB_SAMPLES as SAMPLES, CALIB_SEQ as SEQ, HeldOut, Results, bench_parser  # noqa: E402,E501

STORE = Results("smollm2-distill")
HEADING = "## SmolLM2: quantization-aware distillation"
CALIB = ["--calib", "python-doc", "--calib-samples", str(SAMPLES), "--calib-seq-len", str(SEQ)]
# blocks of 256 tokens, 4 per step: what a ~25-35 min run on the loaded 2-core machine affords
FOS = ["--set", "quantize.nvfp4_scales=four_over_six"]  # student and pack: the 4/6 block-scale rule
BATCH = ["--batch", "4", "--set", "distill.seq_len=256", "--set", "distill.heldout_tokens=0"]

# row -> (format, label, command: "quantize" | "distill", extra arguments, init row or None)
ROWS: dict[str, tuple[str, str, str, list[str], str | None]] = {
    "nvfp4a16/rtn": ("nvfp4a16", "rtn", "quantize", [], None),
    "nvfp4a16/gptq": ("nvfp4a16", "gptq", "quantize", ["--algorithm", "gptq", *CALIB], None),
    "nvfp4a16/distill-gptq": ("nvfp4a16", "distill from gptq (weights, KL, lr 1e-4)", "distill",
                              ["--lr", "1e-4", *BATCH], "nvfp4a16/gptq"),
    "nvfp4a16/distill-rtn": ("nvfp4a16", "distill from rtn (weights, KL, lr 1e-4)", "distill",
                             ["--lr", "1e-4", *BATCH], None),
    # what trains, from the same start and data: the per-block clip of the scales, or a LoRA adapter
    # (rank 16, merged before packing); lr: each mode's default (tfcompile/distill/config.py DEFAULT_LR)
    "nvfp4a16/distill-rtn-scales": ("nvfp4a16", "distill from rtn (block scales: per-block clip, KL, lr 2e-3)",
                                    "distill", ["--lr", "2e-3", "--set", "distill.train=scales", *BATCH], None),
    "nvfp4a16/distill-rtn-lora": ("nvfp4a16", "distill from rtn (LoRA rank 16, KL, lr 1e-3)", "distill",
                                  ["--lr", "1e-3", "--set", "distill.train=lora", *BATCH], None),
    # the learning rate: the weights row above at 3x its lr
    "nvfp4a16/distill-rtn-lr3e-4": ("nvfp4a16", "distill from rtn (weights, KL, lr 3e-4)", "distill",
                                    ["--lr", "3e-4", *BATCH], None),
    # a per-layer feature loss beside KL: mean over layers of ||h_S - h_T||^2 / ||h_T||^2 (distill/loss.py)
    "nvfp4a16/distill-rtn-hidden": ("nvfp4a16", "distill from rtn (weights, KL + 1.0 hidden-state MSE, lr 1e-4)",
                                    "distill", ["--lr", "1e-4", "--set", "distill.hidden_weight=1.0", *BATCH], None),
    "nvfp4a16/gptq-fos": ("nvfp4a16", "gptq + 4/6", "quantize", ["--algorithm", "gptq", *FOS, *CALIB], None),
    "nvfp4a16/distill-gptq-fos": ("nvfp4a16", "distill from gptq + 4/6 (weights, KL, lr 1e-4)", "distill",
                                  ["--lr", "1e-4", *FOS, *BATCH], "nvfp4a16/gptq-fos"),
    "nvfp4a16/distill-gptq-fos-ce": ("nvfp4a16", "distill from gptq + 4/6 (weights, KL + 0.1 CE, lr 1e-4)",
                                     "distill", ["--lr", "1e-4", "--set", "distill.ce_weight=0.1", *FOS, *BATCH],
                                     "nvfp4a16/gptq-fos"),
    "mxfp4a16/rtn": ("mxfp4a16", "rtn", "quantize", [], None),
    "mxfp4a16/gptq": ("mxfp4a16", "gptq", "quantize", ["--algorithm", "gptq", *CALIB], None),
    "mxfp4a16/distill-gptq": ("mxfp4a16", "distill from gptq (weights, KL, lr 1e-4)", "distill",
                              ["--lr", "1e-4", *BATCH], "mxfp4a16/gptq"),
    "mxfp4a16/distill-rtn": ("mxfp4a16", "distill from rtn (weights, KL, lr 1e-4)", "distill",
                             ["--lr", "1e-4", *BATCH], None),
    "mxfp4a16/distill-gptq-ce": ("mxfp4a16", "distill from gptq (weights, KL + 0.1 CE, lr 1e-4)", "distill",
                                 ["--lr", "1e-4", "--set", "distill.ce_weight=0.1", *BATCH], "mxfp4a16/gptq"),
    "mxfp4a16/distill-gptq-2": ("mxfp4a16", "distill from the row above (2nd stage: seed 1, lr 1e-4)", "distill",
                                ["--lr", "1e-4", "--seed", "1", *BATCH], "mxfp4a16/distill-gptq"),
    # W4A4: the activations' static global scale comes from the same calibration in every row
    # RTN's default for W4A4 NVFP4 searches its scales by output error (quantize.scale_search=output);
    # max-based scales are the RTN issue 28 measures recovery against
    "nvfp4/rtn-max": ("nvfp4", "rtn, max-based scales", "quantize",
                      ["--set", "quantize.scale_search=none", *CALIB], None),
    "nvfp4/rtn": ("nvfp4", "rtn (default: scales searched by output error)", "quantize", [*CALIB], None),
    "nvfp4/gptq-fos": ("nvfp4", "gptq + 4/6", "quantize", ["--algorithm", "gptq", *FOS, *CALIB], None),
    "nvfp4/distill-gptq-fos": ("nvfp4", "distill from gptq + 4/6 (weights, KL, lr 1e-4)", "distill",
                               ["--lr", "1e-4", *FOS, *CALIB, *BATCH], "nvfp4/gptq-fos"),
    "nvfp4/distill-rtn-fos": ("nvfp4", "distill from rtn, 4/6 (weights, KL, lr 1e-4)", "distill",
                              ["--lr", "1e-4", *FOS, *CALIB, *BATCH], None),
    "mxfp4/rtn": ("mxfp4", "rtn", "quantize", [], None),
    "mxfp4/gptq": ("mxfp4", "gptq", "quantize", ["--algorithm", "gptq", *CALIB], None),
    "mxfp4/distill-gptq": ("mxfp4", "distill from gptq (weights, KL, lr 1e-4)", "distill",
                           ["--lr", "1e-4", *BATCH], "mxfp4/gptq"),
    "mxfp4/distill-rtn": ("mxfp4", "distill from rtn (weights, KL, lr 1e-4)", "distill", ["--lr", "1e-4", *BATCH], None),
    # a second stage: the distilled artifact as the start, new training blocks (seed 1), the schedule again
    "mxfp4/distill-gptq-2": ("mxfp4", "distill from the row above (2nd stage: seed 1, lr 1e-4)", "distill",
                             ["--lr", "1e-4", "--seed", "1", *BATCH], "mxfp4/distill-gptq"),
}


def run_row(model: Path, work: Path, name: str, steps: int, reuse: bool = False) -> dict:
    """Quantize or distill row `name` into work/; wall seconds, load and the run's own record.
    reuse: a quantize row whose artifact --work holds already is scored, not rebuilt (no wall time)."""
    fmt, _, cmd, args, init = ROWS[name]
    out = work / name.replace("/", "-")
    if reuse and cmd == "quantize" and (out / "tfcompile" / "manifest.json").is_file():
        return {"argv": ["quantize", str(model), "-o", str(out), "--format", fmt, *args], "wall_s": None,
                "reused": True, "load_before": round(os.getloadavg()[0], 1)}
    extra = []
    if cmd == "distill":
        # a killed row resumes where it stopped when rerun with the same --work
        extra = ["--steps", str(steps), "--resume-dir", str(work / f"{out.name}.resume")]
        if init:
            src = work / init.replace("/", "-")
            if not (src / "tfcompile" / "manifest.json").is_file():
                raise SystemExit(f"{name} starts from {init}: run that row first in the same --work ({src})")
            extra += ["--init", str(src)]
    argv = ["tfcompile", cmd, str(model), "-o", str(out), "--format", fmt, "--json", "-q", "--overwrite",
            *args, *extra]
    busy, load = cpu_busy(0.5), os.getloadavg()[0]
    t0 = time.perf_counter()
    res = subprocess.run(argv, capture_output=True, text=True)
    seconds = time.perf_counter() - t0
    if res.returncode != 0:
        raise SystemExit(f"failed: {' '.join(argv)}\n{res.stderr[-3000:]}")
    doc = json.loads(res.stdout)
    m = machine_description()
    row = {"argv": argv[1:], "wall_s": round(seconds, 1), "busy_cores": round(busy, 2),
           "cpu": f"{m['cpu']}, {m.get('capability', '?')}", "date": m["date"],
           "load_before": round(load, 1), "load_after": round(os.getloadavg()[0], 1)}
    if cmd == "distill":
        st, rec = doc["passes"]["distill"], doc["distill"]
        row.update(steps=rec["steps"], train_tokens=rec["tokens"], train_s=st["train_s"], threads=st["threads"],
                   final_loss=rec["final_loss"])
    return row


def table(results: dict) -> str:
    lines = ["| format | method | steps | train tokens | KL (nats/token) | perplexity | change | RTN's increase "
             "recovered | top-1 agreement | wall s | load | CPU |", "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    ref = next(iter(results.values()), None)
    if ref:
        lines.append(f"| bf16 (reference) | - | - | - | 0 | {ref['reference_perplexity']:.3f} | 0 | - | 1 | - | - | - |")
    for name in [n for n in ROWS if n in results]:
        r = results[name]
        rtn = results.get(f"{r['format']}/rtn-max") or results.get(f"{r['format']}/rtn")
        rec = f"{100 * (1 - r['ppl_increase'] / rtn['ppl_increase']):.0f}%" if rtn else "-"
        lines.append(f"| {r['format']} | {r['method']} | {r.get('steps', '-')} | "
                     f"{r.get('train_tokens') or '-'} | {r['kl_mean']:.4f} | {r['perplexity']:.3f} | "
                     f"{100 * r['ppl_increase']:+.2f}% | {rec} | {r['top1_agreement']:.4f} | "
                     f"{'-' if r['wall_s'] is None else round(r['wall_s'])} | "
                     f"{r['load_before']} | {r.get('cpu', '-')} |")
    return "\n".join(lines)


def body(results: dict, tokens: int) -> str:
    """The docs section: how it was run, the table (each row names the CPU it ran on)."""
    import torch

    return (f"Command: `python bench/acc_distill_smollm2.py --steps N --work DIR --write-docs` (`--only ROW` "
            f"remeasures rows; `--reuse` scores a quantize row DIR holds already). Model, held-out text "
            f"(the first {tokens} tokens of the python3.11-doc held-out split, rows of 256) and scoring as in "
            f"\"SmolLM2-135M-Instruct: quantization accuracy\" (bench/heldout.py, bf16); GPTQ and the W4A4 "
            f"activation scales calibrate on {SAMPLES} x {SEQ} tokens of the calib split. Distillation trains on "
            f"the train split (never the held-out text): the steps column's AdamW steps of 4 x 256 tokens, warmup "
            f"10 then cosine, KL(teacher || student), `distill.train=weights`, 2 torch threads, torch "
            f"{torch.__version__}. Each row names its CPU; load is the 1-minute load average when the row "
            f"started (the machine is shared). Wall s: the whole `tfcompile` command (load, calibration or "
            f"distillation, pack, verify); recovered: 1 - (row's perplexity increase) / (RTN's with max-based "
            f"scales), in this table.\n\n" + table(results) + "\n")


def main() -> int:
    ap = bench_parser(__doc__)
    ap.add_argument("--steps", type=int, default=24, help="distillation steps (4 x 256 tokens each)")
    ap.add_argument("--work", type=Path, help="keep the artifacts here (default: a temporary folder)")
    ap.add_argument("--reuse", action="store_true", help="score quantize rows already in --work, not rebuild them")
    ap.add_argument("--list", action="store_true")
    args = ap.parse_args()
    if args.list:
        print("\n".join(ROWS))
        return 0
    results = STORE.load()
    if not args.table:
        from tfcompile.fixtures.smollm2 import smollm2_checkpoint

        model = smollm2_checkpoint()
        held = HeldOut(model, max_tokens=args.max_tokens, dtype="bfloat16")
        with tempfile.TemporaryDirectory(prefix="tfc-distill-smollm2-") as tmp:
            work = args.work or Path(tmp)
            work.mkdir(parents=True, exist_ok=True)
            for name in args.only or list(ROWS):
                row = run_row(model, work, name, args.steps, args.reuse)
                m = held.score_artifact(work / name.replace("/", "-"))
                results[name] = {"format": ROWS[name][0], "method": ROWS[name][1], **row, **m}
                print(f"{name:26s} kl={m['kl_mean']:.5f} ppl={m['perplexity']:.3f} ({100 * m['ppl_increase']:+.2f}%) "
                      f"top1={m['top1_agreement']:.4f} {row['wall_s']}s", file=sys.stderr, flush=True)
                STORE.save(results)
    print(table(results))
    if args.write_docs:
        replace_doc_section(HEADING, body(results, args.max_tokens), DOC)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
