"""What MXFP4 W4A4 needs on SmolLM2: an online block-Hadamard transform inside every Linear's K
(MR-GPTQ, Egiazarian et al. 2025), measured: docs/accuracy.md "SmolLM2-135M-Instruct: MXFP4 W4A4
and online block-Hadamard transforms"; and what the same transforms do for NVFP4 (`--format nvfp4`,
orders 16 and 64: "SmolLM2-135M-Instruct: NVFP4 and online block-Hadamard transforms").

In process, on the bf16 SmolLM2 fixture (tfcompile.fixtures.smollm2), float32 candidates scored on
held-out text by bench/heldout.py (tfcompile eval's metrics) against the bf16 reference. Every
decoder Linear y = x W^T becomes y = Q_a(x R) Q_w(W R)^T with R = I_{K/b} (x) H_b, a block-diagonal
normalized Hadamard matrix of order b (MXFP4: b = 32, one block: the transform mixes only the 32
values that share one E8M0 scale; NVFP4: b = 16, one block, and b = 64; SmolLM2's K = 576 and 1536 rule out 128), so R R^T = I and the
product is unchanged before quantization.
Q_w: tfcompile's weight quantizer of the format (kernels/formats; NVFP4: one global scale per
Linear), by RTN or by tfcompile's GPTQ sweep (passes/quantize/gptq.py `gptq_quantize`, act-order,
damp 0.01) on the rotated Hessian R^T H R (H = X^T X of the unquantized model's inputs on 16 x 512
calib-split tokens); Q_a: the format's activations (W4A4: MXFP4 dynamic; NVFP4 with the static
global scale from the calibration amax of x R, as calibrate records it) or none (W4A16). The transform cannot be fused into the checkpoint (the
activation side runs at inference): an engine must apply it online (docs/accuracy.md "the model
and the methods": only vLLM, through compressed-tensors' transform_config).

    python -m bench run fp4_hadamard [--format mxfp4|nvfp4] [--max-tokens 8192] [--only VARIANT...]
                                     [--render] [--write-docs]
"""

from __future__ import annotations

import functools
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

FORMATS = {  # --format -> (transform orders, docs section)
    "mxfp4": ((32,), "## SmolLM2-135M-Instruct: MXFP4 W4A4 and online block-Hadamard transforms"),
    "nvfp4": ((16, 64), "## SmolLM2-135M-Instruct: NVFP4 and online block-Hadamard transforms"),
}


def linears(model) -> dict[str, torch.nn.Linear]:
    return {n: m for n, m in model.named_modules() if isinstance(m, torch.nn.Linear) and ".layers." in n}


def hessians(model, ids_list, orders) -> tuple[dict[str, torch.Tensor], dict[tuple[str, int], float]]:
    """X^T X (float64 sums, float32 result [K, K]) of every decoder Linear's input, and the amax of
    x R for each transform order (order 0: x itself), as calibration records a static scale's."""
    out: dict[str, torch.Tensor] = {}
    amax: dict[tuple[str, int], float] = {}

    def add(name, x):
        x = x.reshape(-1, x.shape[-1]).float()
        out[name] = out.get(name, 0) + x.double().T @ x.double()
        for b in (0, *orders):
            a = float((x if not b else x @ transform(x.shape[-1], b)).abs().max())
            amax[name, b] = max(amax.get((name, b), 0.0), a)

    hooks = [m.register_forward_pre_hook(lambda _m, a, n=n: add(n, a[0])) for n, m in linears(model).items()]
    with torch.inference_mode():
        for ids in ids_list:
            model(input_ids=ids)
    for h in hooks:
        h.remove()
    return {n: h.float() for n, h in out.items()}, amax


@functools.lru_cache(maxsize=16)
def transform(k: int, order: int) -> torch.Tensor:
    """R [K, K]: block-diagonal Hadamard of `order` (0: the identity); built once per (K, order), as
    the calibration hooks ask for it on every batch of every Linear (read only)."""
    if not order:
        return torch.eye(k)
    return torch.block_diag(*[rotation(order, "hadamard", 0).float()] * (k // order))


def quantize_model(model, fmt: str, hs: dict, amax: dict, order: int, method: str, acts: bool):
    """Every decoder Linear as Q_a(x R) Q_w(W R)^T (module docstring), in place."""
    wq, aq = weight_quantizer(fmt), act_quantizer(fmt)
    for name, m in linears(model).items():
        w = m.weight.data.float()
        r = transform(w.shape[1], order)
        wr = w @ r
        q = wq.quantize(wr)
        if method == "gptq":
            q = gptq_quantize(wr, r.T @ hs[name] @ r, q)
        m.weight.data = dequantize(q).float() if method != "none" else wr
        scale = aq.static_scale(amax[name, order], torch.float32) if acts and aq.static else None
        m.register_forward_pre_hook(lambda _m, a, r=r, s=scale: (_act(aq, a[0] @ r, acts, s),) + tuple(a[1:]))
    return model


def _act(aq, x: torch.Tensor, acts: bool, scale) -> torch.Tensor:
    return aq.fake_quant(x, scale) if acts else x


def variants(fmt: str) -> dict[str, tuple[int, str, bool]]:
    """name -> (transform order, weights: none | rtn | gptq, activations quantized)."""
    orders = FORMATS[fmt][0]
    out = {f"rotated ({orders[-1]}), nothing quantized": (orders[-1], "none", False)}
    for acts, kind in ((False, "W4A16"), (True, "W4A4")):
        for method in ("rtn", "gptq"):
            out[f"{kind} {method.upper()}"] = (0, method, acts)
            out.update({f"{kind} {method.upper()} + Hadamard-{b}": (b, method, acts) for b in orders})
    return out


def measure(fmt: str, max_tokens: int, only: list[str]) -> dict:
    from transformers import AutoConfig, AutoModelForCausalLM

    from tfcompile.calibration.datasets import calibration_tokens
    from tfcompile.evaluate.text import load_tokenizer
    from tfcompile.fixtures.smollm2 import smollm2_checkpoint

    path = smollm2_checkpoint()
    cfg = AutoConfig.from_pretrained(path)
    base = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    held = HeldOut(path, max_tokens=max_tokens, dtype="bfloat16")
    calib = calibration_tokens("python-doc", load_tokenizer(path), samples=16, seq_len=512, seed=0).split(4)
    hs, amax = hessians(base, calib, FORMATS[fmt][0])
    res = store(fmt).load() or {}
    res.update(tokens=held.tokens, machine=f"{machine_line()}, {torch.get_num_threads()} torch threads, "
               f"1-minute load {os.getloadavg()[0]:.1f} at the start (a shared machine: seconds are not a benchmark)")
    rows = res.setdefault("variants", {})
    for name, (order, method, acts) in variants(fmt).items():
        if only and name not in only:
            continue
        t0 = time.perf_counter()
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval()
        model.load_state_dict(base.state_dict())
        quantize_model(model, fmt, hs, amax, order, method, acts)
        m = held.score(model)
        rows[name] = {"kl": round(m["kl_mean"], 4), "ppl": round(m["perplexity"], 3),
                      "ppl_increase": round(m["ppl_increase"], 4), "top1": round(m["top1_agreement"], 4),
                      "seconds": round(time.perf_counter() - t0, 1)}
        print(name, rows[name], file=sys.stderr, flush=True)
        store(fmt).save(res)
    return res


def store(fmt: str) -> Results:
    return Results(f"smollm2-{fmt}-hadamard")


def body(fmt: str, res: dict) -> str:
    lines = [f"Command: `python -m bench run fp4_hadamard --format {fmt} --max-tokens {res['tokens']} --write-docs` "
             f"(bench/studies/fp4_hadamard.py: in process, tfcompile's {fmt.upper()} quantizers and GPTQ sweep, every "
             f"decoder Linear; the "
             f"first {res['tokens']} held-out python-doc tokens, float32 candidates against the bf16 reference; "
             f"machine: {res['machine']}).\n",
             "| variant | KL (nats/token) | perplexity | change | top-1 agreement | s |", "|---|---:|---:|---:|---:|---:|"]
    for name in [n for n in variants(fmt) if n in res["variants"]]:
        v = res["variants"][name]
        lines.append(f"| {name} | {v['kl']:.4f} | {v['ppl']:.3f} | {100 * v['ppl_increase']:+.2f}% | {v['top1']:.4f} "
                     f"| {v['seconds']:.0f} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--format", choices=list(FORMATS), default="mxfp4")
    ap.add_argument("--max-tokens", type=int, default=8192)
    ap.add_argument("--only", nargs="+", default=[], metavar="VARIANT", help="names: see the docs tables")
    ap.add_argument("--write-docs", action="store_true", help="rewrite the table of docs/accuracy.md's section")
    ap.add_argument("--render", action="store_true", help="measure nothing: the stored rows only")
    args = ap.parse_args()
    res = store(args.format).load() if args.render else measure(args.format, args.max_tokens, args.only)
    print(body(args.format, res))
    if args.write_docs:
        replace_doc_section(FORMATS[args.format][1], body(args.format, res), ACCURACY_DOC)


if __name__ == "__main__":
    main()
