"""What MXFP4 W4A4 needs on SmolLM2: an online block-Hadamard transform inside every Linear's K
(MR-GPTQ, Egiazarian et al. 2025), measured: docs/accuracy.md "SmolLM2-135M-Instruct: MXFP4 W4A4
and online block-Hadamard transforms".

In process, on the bf16 SmolLM2 fixture (tfcompile.fixtures.smollm2), float32 candidates scored on
held-out text by bench/heldout.py (tfcompile eval's metrics) against the bf16 reference. Every
decoder Linear y = x W^T becomes y = Q_a(x R) Q_w(W R)^T with R = I_{K/b} (x) H_b, a block-diagonal
normalized Hadamard matrix of order b = 32 (one MXFP4 block: the transform mixes only the 32
values that share one E8M0 scale), so R R^T = I and the product is unchanged before quantization.
Q_w: tfcompile's MXFP4 weight quantizer (kernels/formats), by RTN or by tfcompile's GPTQ sweep
(passes/quantize/gptq.py `gptq_quantize`, act-order, damp 0.01) on the rotated Hessian R^T H R
(H = X^T X of the unquantized model's inputs on 16 x 512 calib-split tokens); Q_a: MXFP4 dynamic
activations (W4A4) or none (W4A16). The transform cannot be fused into the checkpoint (the
activation side runs at inference): an engine must apply it online (docs/accuracy.md "the model
and the methods": only vLLM, through compressed-tensors' transform_config).

    python -m bench run mxfp4_hadamard [--max-tokens 8192] [--only VARIANT...] [--render] [--write-docs]

`--artifacts` measures what `tfcompile quantize --set quantize.online_hadamard=32` writes instead (real
artifacts, GPTQ, mxfp4a16 and mxfp4; the transform_config vLLM reads), scored by `HeldOut.score_artifact`
(tfcompile eval's emulation, the online x R included) as the other SmolLM2 rows are, into the section
ARTIFACT_HEADING of docs/accuracy.md.
"""

from __future__ import annotations

import os
import sys
import time

import torch

from bench.common import machine_line, replace_doc_section
from bench.heldout import ACCURACY_DOC, HeldOut, Results

from tfcompile.kernels.formats import dequantize
from tfcompile.kernels.formats.quantizer import act_quantizer, weight_quantizer
from tfcompile.passes.quantize.gptq import gptq_quantize
from tfcompile.rotate.hadamard import rotation

STORE = Results("smollm2-mxfp4-hadamard")
HEADING = "## SmolLM2-135M-Instruct: MXFP4 W4A4 and online block-Hadamard transforms"
BLOCK = 32  # MXFP4's block: the transform's order
WQ, AQ = weight_quantizer("mxfp4"), act_quantizer("mxfp4")


def linears(model) -> dict[str, torch.nn.Linear]:
    return {n: m for n, m in model.named_modules() if isinstance(m, torch.nn.Linear) and ".layers." in n}


def hessians(model, ids_list) -> dict[str, torch.Tensor]:
    """X^T X (float64 sums, float32 result [K, K]) of every decoder Linear's input."""
    out: dict[str, torch.Tensor] = {}

    def add(name, x):
        x = x.reshape(-1, x.shape[-1]).double()
        out[name] = out.get(name, 0) + x.T @ x

    hooks = [m.register_forward_pre_hook(lambda _m, a, n=n: add(n, a[0])) for n, m in linears(model).items()]
    with torch.inference_mode():
        for ids in ids_list:
            model(input_ids=ids)
    for h in hooks:
        h.remove()
    return {n: h.float() for n, h in out.items()}


def transform(k: int, rotate: bool) -> torch.Tensor:
    """R [K, K]: block-diagonal Hadamard of order BLOCK (rotate), or the identity."""
    if not rotate:
        return torch.eye(k)
    return torch.block_diag(*[rotation(BLOCK, "hadamard", 0).float()] * (k // BLOCK))


def quantize_model(model, hs: dict, rotate: bool, method: str, acts: bool):
    """Every decoder Linear as Q_a(x R) Q_w(W R)^T (module docstring), in place."""
    for name, m in linears(model).items():
        w = m.weight.data.float()
        r = transform(w.shape[1], rotate)
        wr = w @ r
        q = WQ.quantize(wr)
        if method == "gptq":
            q = gptq_quantize(wr, r.T @ hs[name] @ r, q)
        m.weight.data = dequantize(q).float() if method != "none" else wr
        m.register_forward_pre_hook(lambda _m, a, r=r: (_act(a[0] @ r, acts),) + tuple(a[1:]))
    return model


def _act(x: torch.Tensor, acts: bool) -> torch.Tensor:
    return AQ.fake_quant(x) if acts else x


VARIANTS = {  # name -> (rotate, weights: none | rtn | gptq, activations quantized)
    "rotated, nothing quantized": (True, "none", False),
    "W4A16 RTN": (False, "rtn", False), "W4A16 RTN + Hadamard-32": (True, "rtn", False),
    "W4A16 GPTQ": (False, "gptq", False), "W4A16 GPTQ + Hadamard-32": (True, "gptq", False),
    "W4A4 RTN": (False, "rtn", True), "W4A4 RTN + Hadamard-32": (True, "rtn", True),
    "W4A4 GPTQ": (False, "gptq", True), "W4A4 GPTQ + Hadamard-32": (True, "gptq", True),
}


def measure(max_tokens: int, only: list[str]) -> dict:
    from transformers import AutoConfig, AutoModelForCausalLM

    from tfcompile.calibration.datasets import calibration_tokens
    from tfcompile.evaluate.text import load_tokenizer
    from tfcompile.fixtures.smollm2 import smollm2_checkpoint

    path = smollm2_checkpoint()
    cfg = AutoConfig.from_pretrained(path)
    base = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    held = HeldOut(path, max_tokens=max_tokens, dtype="bfloat16")
    calib = calibration_tokens("python-doc", load_tokenizer(path), samples=16, seq_len=512, seed=0).split(4)
    hs = hessians(base, calib)
    res = STORE.load() or {}
    res.update(tokens=held.tokens, machine=f"{machine_line()}, {torch.get_num_threads()} torch threads, "
               f"1-minute load {os.getloadavg()[0]:.1f} at the start (a shared machine: seconds are not a benchmark)")
    rows = res.setdefault("variants", {})
    for name, (rotate, method, acts) in VARIANTS.items():
        if only and name not in only:
            continue
        t0 = time.perf_counter()
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval()
        model.load_state_dict(base.state_dict())
        quantize_model(model, hs, rotate, method, acts)
        m = held.score(model)
        rows[name] = {"kl": round(m["kl_mean"], 4), "ppl": round(m["perplexity"], 3),
                      "ppl_increase": round(m["ppl_increase"], 4), "top1": round(m["top1_agreement"], 4),
                      "seconds": round(time.perf_counter() - t0, 1)}
        print(name, rows[name], file=sys.stderr, flush=True)
        STORE.save(res)
    return res


def body(res: dict) -> str:
    lines = [f"Command: `python -m bench run mxfp4_hadamard --max-tokens {res['tokens']} --write-docs` (bench/studies/"
             f"mxfp4_hadamard.py: in process, tfcompile's MXFP4 quantizers and GPTQ sweep, every decoder Linear; the "
             f"first {res['tokens']} held-out python-doc tokens, float32 candidates against the bf16 reference; "
             f"machine: {res['machine']}).\n",
             "| variant | KL (nats/token) | perplexity | change | top-1 agreement | s |", "|---|---:|---:|---:|---:|---:|"]
    for name in [n for n in VARIANTS if n in res["variants"]]:
        v = res["variants"][name]
        lines.append(f"| {name} | {v['kl']:.4f} | {v['ppl']:.3f} | {100 * v['ppl_increase']:+.2f}% | {v['top1']:.4f} "
                     f"| {v['seconds']:.0f} |")
    return "\n".join(lines) + "\n"


ARTIFACT_HEADING = "## SmolLM2-135M-Instruct: MXFP4 artifacts with an online block-Hadamard transform"
ARTIFACT_FORMATS = ("mxfp4a16", "mxfp4")
EMULATED = {"mxfp4a16": "W4A16 GPTQ + Hadamard-32", "mxfp4": "W4A4 GPTQ + Hadamard-32"}  # the study's rows
# those rows as docs/accuracy.md's study table states them (2026-12-05), for a machine whose store lacks them
STUDY_ROWS = {"W4A16 GPTQ + Hadamard-32": {"kl": 0.1051, "ppl_increase": 0.0587},
              "W4A4 GPTQ + Hadamard-32": {"kl": 0.4011, "ppl_increase": 0.4110}}


def artifact_command(fmt: str, src, out) -> list[str]:
    return ["tfcompile", "quantize", str(src), "-o", str(out), "--format", fmt, "--algorithm", "gptq", "--calib",
            "python-doc", "--calib-samples", "16", "--calib-seq-len", "512", "--set", "quantize.online_hadamard=32",
            "-q", "--overwrite"]


def measure_artifacts(max_tokens: int) -> dict:
    """Quantize SmolLM2 with the transform (wall seconds of the whole process) and score each artifact."""
    import subprocess
    import tempfile

    from tfcompile.fixtures.smollm2 import smollm2_checkpoint

    src, res = smollm2_checkpoint(), STORE.load() or {}
    held = HeldOut(src, max_tokens=max_tokens, dtype="bfloat16")
    rows = res.setdefault("artifacts", {})
    with tempfile.TemporaryDirectory(prefix="mxfp4-hadamard-") as tmp:
        for fmt in ARTIFACT_FORMATS:
            t0 = time.perf_counter()
            subprocess.run(artifact_command(fmt, src, f"{tmp}/{fmt}"), check=True)
            seconds = time.perf_counter() - t0
            m = held.score_artifact(f"{tmp}/{fmt}")
            rows[fmt] = {"kl": round(m["kl_mean"], 4), "ppl": round(m["perplexity"], 3),
                         "ppl_increase": round(m["ppl_increase"], 4), "top1": round(m["top1_agreement"], 4),
                         "quantize_s": round(seconds, 1), "load": round(os.getloadavg()[0], 1)}
            print(fmt, rows[fmt], file=sys.stderr, flush=True)
            STORE.save(res)
    res["artifact_machine"] = f"{machine_line()}, {torch.get_num_threads()} torch threads"
    STORE.save(res)
    return res


def artifact_body(res: dict) -> str:
    cmd = " ".join(artifact_command("FORMAT", "SMOLLM2", "OUT")[:-1])
    lines = [f"Command: `{cmd}` for FORMAT in mxfp4a16, mxfp4, each artifact scored by `HeldOut(SMOLLM2, "
             "max_tokens=8192, dtype=\"bfloat16\").score_artifact(OUT)` (bench/heldout.py: tfcompile eval's "
             "emulation, x R included; the first 8192 held-out python-doc tokens against the bf16 reference) "
             "as the other SmolLM2 rows; all of it: `python -m bench run mxfp4_hadamard --artifacts --write-docs`. "
             f"Machine: {res.get('artifact_machine', '?')} (shared: quantize seconds are not a benchmark).\n",
             "| artifact | KL (nats/token) | perplexity | change | top-1 agreement | quantize s (1-min load) | "
             "emulated in the study (KL, change) |", "|---|---:|---:|---:|---:|---:|---:|"]
    for fmt in [f for f in ARTIFACT_FORMATS if f in res.get("artifacts", {})]:
        v, e = res["artifacts"][fmt], res.get("variants", {}).get(EMULATED[fmt], STUDY_ROWS[EMULATED[fmt]])
        emu = f"{e['kl']:.4f}, {100 * e['ppl_increase']:+.2f}%"
        lines.append(f"| {fmt} GPTQ + online Hadamard-32 | {v['kl']:.4f} | {v['ppl']:.3f} | "
                     f"{100 * v['ppl_increase']:+.2f}% | {v['top1']:.4f} | {v['quantize_s']:.0f} ({v['load']:.0f}) "
                     f"| {emu} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--max-tokens", type=int, default=8192)
    ap.add_argument("--only", nargs="+", default=[], choices=list(VARIANTS), metavar="VARIANT")
    ap.add_argument("--write-docs", action="store_true", help="rewrite the table of docs/accuracy.md's section")
    ap.add_argument("--render", action="store_true", help="measure nothing: the stored rows only")
    ap.add_argument("--artifacts", action="store_true", help="measure tfcompile's artifacts with the transform")
    args = ap.parse_args()
    if args.artifacts:
        res = STORE.load() if args.render else measure_artifacts(args.max_tokens)
        print(artifact_body(res))
        if args.write_docs:
            replace_doc_section(ARTIFACT_HEADING, artifact_body(res), ACCURACY_DOC)
        return
    res = STORE.load() if args.render else measure(args.max_tokens, args.only)
    print(body(res))
    if args.write_docs:
        replace_doc_section(HEADING, body(res), ACCURACY_DOC)


if __name__ == "__main__":
    main()
