"""Real SmolLM2 artifacts with an online block-Hadamard transform (`quantize.online_hadamard=B`), beside
the in-process emulation of bench/studies/fp4_hadamard.py: docs/accuracy.md "SmolLM2-135M-Instruct:
artifacts with an online block-Hadamard transform".

Each case is `tfcompile quantize` of the SmolLM2 fixture with GPTQ on 16 x 512 python-doc calib tokens
and the transform (the transform_config vLLM reads), scored by `HeldOut.score_artifact` (tfcompile
eval's emulation, the online x R included; the first 8192 held-out tokens against the bf16
reference) as the other SmolLM2 rows are.

    python -m bench run online_hadamard_artifacts [--only mxfp4a16/32 ...] [--render] [--write-docs]
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time

import torch

from bench.common import machine_line, replace_doc_section
from bench.heldout import ACCURACY_DOC, HeldOut, Results

STORE = Results("smollm2-online-hadamard-artifacts")
HEADING = "## SmolLM2-135M-Instruct: artifacts with an online block-Hadamard transform"
CASES = ("mxfp4a16/32", "mxfp4/32", "nvfp4a16/64", "nvfp4a16/64/seed1", "nvfp4a16/64/damp0.001",
         "nvfp4a16/64/damp0.001/seed1", "nvfp4a16/64/damp0.001/seed2")  # format / order[/variants]
# a variant's flags on top of the case's command: the GPTQ dampening of the best plain nvfp4a16 row, and a
# second calibration draw (the spread of GPTQ solves on these 8192 tokens is about 1.6% of bf16's perplexity)
VARIANTS = {"damp0.001": ["--set", "quantize.gptq_damp=0.001"], "seed1": ["--calib-seed", "1"], "seed2": ["--calib-seed", "2"]}
# the study's emulated rows of the same recipe (docs/accuracy.md, bench/studies/fp4_hadamard.py): KL, change
EMULATED = {"mxfp4a16/32": (0.1051, 0.0587), "mxfp4/32": (0.4011, 0.4110), "nvfp4a16/64": (0.0719, 0.0381)}


def command(case: str, src, out) -> list[str]:
    fmt, order, *variant = case.split("/")
    extra = [f for v in variant for f in VARIANTS[v]]
    return ["tfcompile", "quantize", str(src), "-o", str(out), "--format", fmt, "--algorithm", "gptq", "--calib",
            "python-doc", "--calib-samples", "16", "--calib-seq-len", "512", "--set",
            f"quantize.online_hadamard={order}", *extra, "-q", "--overwrite"]


def measure(max_tokens: int, only: list[str]) -> dict:
    """Quantize SmolLM2 per case (wall seconds of the whole process) and score each artifact."""
    from tfcompile.fixtures.smollm2 import smollm2_checkpoint

    src, res = smollm2_checkpoint(), STORE.load() or {}
    held = HeldOut(src, max_tokens=max_tokens, dtype="bfloat16")
    rows = res.setdefault("artifacts", {})
    with tempfile.TemporaryDirectory(prefix="online-hadamard-") as tmp:
        for case in [c for c in CASES if not only or c in only]:
            out = f"{tmp}/{case.replace('/', '-')}"
            load, t0 = os.getloadavg()[0], time.perf_counter()
            subprocess.run(command(case, src, out), check=True)
            seconds = time.perf_counter() - t0
            m = held.score_artifact(out)
            rows[case] = {"kl": round(m["kl_mean"], 4), "ppl": round(m["perplexity"], 3),
                          "ppl_increase": round(m["ppl_increase"], 4), "top1": round(m["top1_agreement"], 4),
                          "quantize_s": round(seconds, 1), "load": round(load, 1),
                          "machine": f"{machine_line()}, {torch.get_num_threads()} torch threads"}
            print(case, rows[case], file=sys.stderr, flush=True)
            STORE.save(res)
    return res


def body(res: dict) -> str:
    cmd = " ".join(command("FORMAT/B", "SMOLLM2", "OUT")[:-1])
    lines = [f"Command: `{cmd}` per case, each artifact scored "
             "by `HeldOut(SMOLLM2, max_tokens=8192, dtype=\"bfloat16\").score_artifact(OUT)` (bench/heldout.py: "
             "tfcompile eval's emulation, x R included; the first 8192 held-out python-doc tokens against the bf16 "
             "reference) as the other SmolLM2 rows; all of it: `python -m bench run online_hadamard_artifacts "
             "--write-docs`. Quantize seconds: the whole process on a shared machine (1-minute load at its start), "
             "not a benchmark.\n",
             "| artifact | KL (nats/token) | perplexity | change | top-1 agreement | quantize s (load) | "
             "emulated in the study (KL, change) | machine |", "|---|---:|---:|---:|---:|---:|---:|---|"]
    for case in [c for c in CASES if c in res.get("artifacts", {})]:
        v = res["artifacts"][case]
        fmt, order, *variant = case.split("/")
        emulated = "-" if case not in EMULATED else f"{EMULATED[case][0]:.4f}, {100 * EMULATED[case][1]:+.2f}%"
        label = f"{fmt} GPTQ + online Hadamard-{order}" + "".join(f" ({' '.join(VARIANTS[x])})" for x in variant)
        lines.append(f"| {label} | {v['kl']:.4f} | {v['ppl']:.3f} | "
                     f"{100 * v['ppl_increase']:+.2f}% | {v['top1']:.4f} | {v['quantize_s']:.0f} ({v['load']:.0f}) "
                     f"| {emulated} | {v['machine']} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--max-tokens", type=int, default=8192)
    ap.add_argument("--only", nargs="+", default=[], choices=CASES, metavar="CASE")
    ap.add_argument("--write-docs", action="store_true", help="rewrite the table of docs/accuracy.md's section")
    ap.add_argument("--render", action="store_true", help="measure nothing: the stored rows only")
    args = ap.parse_args()
    res = STORE.load() if args.render else measure(args.max_tokens, args.only)
    print(body(res))
    if args.write_docs:
        replace_doc_section(HEADING, body(res), ACCURACY_DOC)


if __name__ == "__main__":
    main()
