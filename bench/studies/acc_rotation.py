"""Why fused rotations hurt SmolLM2 under round-to-nearest NVFP4: the measurements behind
docs/accuracy.md "SmolLM2-135M-Instruct: why rotations hurt".

In process, on the bf16 SmolLM2 fixture (tfcompile.fixtures.smollm2; weights with GGUF Q4_1
rounding), each variant is the fp32 state dict rotated by tfcompile's own fold
(tfcompile/rotate/fuse.py) and fake-quantized with tfcompile's NVFP4 quantizer (RTN, one global
scale per fusion group: q/k/v and gate/up share one, as `tfcompile quantize` writes them), then
scored on held-out text by bench/heldout.py (tfcompile eval's metrics) against the bf16
reference; the candidates run in float32 (bf16 matmuls are several times slower on CPU; the
rounding to bf16 alone costs KL ~0.001 on this model):

- the rotated model with nothing quantized (is the fold exact?);
- W4A16 and W4A4 (activations: NVFP4 with a static global scale from the calib split's amax,
  per-16 block scales at run time) for: no rotation, R1 + R2 as `rotate.kind=hadamard` with
  `keep_suppressed=false` (every channel rotated), R2 alone, R1 + R2 leaving the switched-off
  channels unrotated (the default), and that R1 alone;
- the massive activations (largest |h| per residual channel, first token vs the rest) and the
  residual channels the norms switch off (fuse.suppressed_channels);
- per projection, the output SQNR of the quantized weight on the held-out activations, on the
  first token of each row and on the others, unrotated and fully rotated (median over layers).

    python -m bench run acc_rotation [--max-tokens 2048] [--write-docs]
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[2]
from bench.common import replace_doc_section  # noqa: E402
from bench.heldout import ACCURACY_DOC, HeldOut, Results  # noqa: E402

from tfcompile.kernels.formats import dequantize  # noqa: E402
from tfcompile.kernels.formats.nvfp4 import nvfp4_global_scale, quantize_nvfp4, quantize_nvfp4_act  # noqa: E402
from tfcompile.rotate import fuse  # noqa: E402
from tfcompile.rotate.hadamard import rotation, rotation_keeping  # noqa: E402

STORE = Results("smollm2-rotation")
HEADING = "## SmolLM2-135M-Instruct: why rotations hurt"
GROUPS = (("self_attn", ("q_proj", "k_proj", "v_proj")), ("self_attn", ("o_proj",)),
          ("mlp", ("gate_proj", "up_proj")), ("mlp", ("down_proj",)))
THRESHOLD = 0.01  # passes/rotate.py SUPPRESSED
# variant -> (R1: "none" | "hadamard" | "random", keep the switched-off channels, R2)
VARIANTS = {"unrotated": ("none", False, False), "R1+R2, every channel": ("hadamard", False, True),
            "R2 only": ("none", False, True), "R1+R2, switched-off kept": ("hadamard", True, True),
            "R1 only, switched-off kept": ("hadamard", True, False)}


def rotate_sd(sd: dict, cfg, r1: str, keep: tuple[int, ...], heads: bool) -> dict:
    """The state dict as passes/rotate.py writes it (float32; lm_head untied)."""
    h, nh = cfg.hidden_size, cfg.num_attention_heads
    q1 = torch.eye(h, dtype=torch.float64) if r1 == "none" else rotation_keeping(h, keep, r1, 0)
    rot = fuse.Rotations(q1, rotation(h // nh, "hadamard", 1) if heads else None, cfg.num_key_value_heads, nh, h // nh)
    return {n: fuse.rotated(n, sd.__getitem__, rot) for n in sd}


def quantize_sd(sd: dict, layers: int) -> dict:
    """Every decoder Linear NVFP4 RTN (dequantized), one global scale per fusion group."""
    out = dict(sd)
    for i in range(layers):
        for mod, projs in GROUPS:
            names = [f"model.layers.{i}.{mod}.{p}.weight" for p in projs]
            g = nvfp4_global_scale(torch.stack([sd[n].abs().amax() for n in names]).amax())
            for n in names:
                out[n] = dequantize(quantize_nvfp4(sd[n], global_scale=g)).float()
    return out


def build(cfg, sd: dict, dtype=torch.float32):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_config(cfg, dtype=dtype).eval()
    model.load_state_dict({k: v.to(dtype) for k, v in sd.items()})
    return model


def linear_inputs(model, ids_list) -> dict[str, list[torch.Tensor]]:
    """Every decoder Linear's input on `ids_list` (float32 [batch, seq, K] per batch)."""
    seen: dict[str, list[torch.Tensor]] = {}
    hooks = [m.register_forward_pre_hook(lambda _m, a, n=n: seen.setdefault(n, []).append(a[0].float()))
             for n, m in model.named_modules() if isinstance(m, torch.nn.Linear) and ".layers." in n]
    with torch.inference_mode():
        for ids in ids_list:
            model(input_ids=ids)
    for h in hooks:
        h.remove()
    return seen


def with_act_quant(model, amax: dict[str, float]):
    """NVFP4 activations (W4A4): static global scale from `amax`, per-16 block scales per token."""
    for n, m in model.named_modules():
        if n in amax:
            g = nvfp4_global_scale(torch.tensor(amax[n]))
            m.register_forward_pre_hook(lambda _m, a, g=g: (dequantize(quantize_nvfp4_act(a[0].float(), g)).to(a[0].dtype),))
    return model


def massive(cfg, sd: dict, ids_list) -> dict:
    model = build(cfg, sd, torch.float32)
    with torch.inference_mode():
        hs = [torch.stack(model(input_ids=ids, output_hidden_states=True).hidden_states) for ids in ids_list]
    h = torch.cat(hs, 1).abs()  # [layers + 1, rows, seq, H]
    per_layer = []
    for i in range(1, cfg.num_hidden_layers + 1):
        top = h[i].amax((0, 1)).topk(3)
        per_layer.append({"layer_input": i, "channels": top.indices.tolist(), "max_abs": [round(v, 1) for v in top.values.tolist()],
                          "rms_first_token": round(h[i][:, 0].pow(2).mean().sqrt().item(), 2),
                          "rms_other_tokens": round(h[i][:, 1:].pow(2).mean(-1).sqrt().median().item(), 2)})
    off = {}
    for norm in fuse.RESIDUAL_NORMS:
        for c in fuse.suppressed_channels(sd.__getitem__, cfg.num_hidden_layers, THRESHOLD):
            g = torch.stack([sd[f"model.layers.{i}.{norm}.weight"].abs() / sd[f"model.layers.{i}.{norm}.weight"].abs().median()
                             for i in range(cfg.num_hidden_layers)])[:, c]
            off.setdefault(str(c), {})[norm] = [i for i, v in enumerate(g.tolist()) if v < THRESHOLD]
    return {"layers": per_layer, "switched_off": off}


def sqnr(cfg, sd: dict, rsd: dict, ids_list) -> dict:
    """Median over layers of each projection's output SQNR (dB), first token / other tokens."""
    out = {}
    for tag, s in (("unrotated", sd), ("rotated", rsd)):
        q = quantize_sd(s, cfg.num_hidden_layers)
        xs = linear_inputs(build(cfg, s, torch.float32), ids_list)
        for n, parts in xs.items():
            w = s[n + ".weight"]
            dw = q[n + ".weight"] - w
            x = torch.cat(parts)
            for where, sl in (("first", slice(0, 1)), ("others", slice(1, None))):
                xi = x[:, sl].reshape(-1, x.shape[-1])
                db = 10 * math.log10((xi @ w.T).pow(2).sum().item() / (xi @ dw.T).pow(2).sum().item())
                out.setdefault(f"{n.split('.')[-1]} {where} {tag}", []).append(db)
    return {k: round(sorted(v)[len(v) // 2], 1) for k, v in sorted(out.items())}


def measure(max_tokens: int) -> dict:
    from safetensors.torch import load_file
    from transformers import AutoConfig

    from tfcompile.calibration.datasets import calibration_tokens
    from tfcompile.evaluate.text import load_tokenizer
    from tfcompile.fixtures.smollm2 import smollm2_checkpoint

    path = smollm2_checkpoint()
    cfg = AutoConfig.from_pretrained(path, tie_word_embeddings=False)
    sd = {k: v.float() for k, v in load_file(str(path / "model.safetensors")).items()}
    sd.setdefault("lm_head.weight", sd["model.embed_tokens.weight"])
    held = HeldOut(path, max_tokens=max_tokens, dtype="bfloat16")
    calib = calibration_tokens("python-doc", load_tokenizer(path), samples=4, seq_len=256, seed=0).split(1)
    keep = fuse.suppressed_channels(sd.__getitem__, cfg.num_hidden_layers, THRESHOLD)
    res = {"tokens": held.tokens, "kept": list(keep), "variants": {}}
    full = rotate_sd(sd, cfg, "hadamard", (), True)
    res["exact"] = _pick(held.score(build(cfg, full)))
    for name, (r1, kept, heads) in VARIANTS.items():
        s = sd if r1 == "none" and not heads else rotate_sd(sd, cfg, r1, keep if kept else (), heads)
        amax = {n: max(t.abs().max().item() for t in ts) for n, ts in linear_inputs(build(cfg, s), calib).items()}
        q = quantize_sd(s, cfg.num_hidden_layers)
        res["variants"][name] = {"w4a16": _pick(held.score(build(cfg, q))),
                                 "w4a4": _pick(held.score(with_act_quant(build(cfg, q), amax)))}
        print(name, res["variants"][name], file=sys.stderr, flush=True)
    few = held.work[: max(1, len(held.work) // 2)]
    res["massive"] = massive(cfg, sd, few)
    res["sqnr"] = sqnr(cfg, sd, full, few)
    return res


def _pick(m: dict) -> dict:
    return {"kl": round(m["kl_mean"], 4), "ppl_increase": round(m["ppl_increase"], 4), "top1": round(m["top1_agreement"], 4)}


def body(res: dict) -> str:
    lines = [f"Command: `python -m bench run acc_rotation --max-tokens {res['tokens']} --write-docs` (in process: "
             f"tfcompile's fold and NVFP4 quantizer, RTN, one global scale per fusion group; the first "
             f"{res['tokens']} held-out tokens, float32 candidates against the bf16 reference; W4A4 activation "
             f"global scales from 4 x 256 calib-split tokens). The rotated model with nothing quantized: KL "
             f"{res['exact']['kl']}, top-1 {res['exact']['top1']} (a float32 model against the bf16 reference: "
             f"this is bf16's own rounding; the fold is exact).\n",
             "| variant | W4A16 KL | W4A16 ppl | W4A4 KL | W4A4 ppl |", "|---|---:|---:|---:|---:|"]
    for name, v in res["variants"].items():
        a, b = v["w4a16"], v["w4a4"]
        lines.append(f"| {name} | {a['kl']:.4f} | {100 * a['ppl_increase']:+.2f}% | {b['kl']:.4f} | {100 * b['ppl_increase']:+.2f}% |")
    lines += ["", f"Switched-off channels (|g| < {THRESHOLD:.0%} of the median in some residual norm): "
              f"{', '.join(map(str, res['kept']))}; where: " + "; ".join(
                  f"{c}: " + ", ".join(f"{n} layers {v}" for n, v in d.items() if v) for c, d in res["massive"]["switched_off"].items()),
              "", "| decoder layer input | largest \\|h\\| (channel) | RMS, first token | RMS, other tokens (median) |",
              "|---:|---|---:|---:|"]
    for r in res["massive"]["layers"][::3]:
        tops = ", ".join(f"{v:g} ({c})" for c, v in zip(r["channels"], r["max_abs"]))
        lines.append(f"| {r['layer_input'] - 1} | {tops} | {r['rms_first_token']:g} | {r['rms_other_tokens']:g} |")
    lines += ["", "Output SQNR (dB) of each quantized projection on the held-out activations, median over the 30 layers:", "",
              "| projection | first token, unrotated | first token, rotated | other tokens, unrotated | other tokens, rotated |",
              "|---|---:|---:|---:|---:|"]
    s = res["sqnr"]
    for p in ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"):
        lines.append(f"| {p} | {s[f'{p} first unrotated']} | {s[f'{p} first rotated']} | "
                     f"{s[f'{p} others unrotated']} | {s[f'{p} others rotated']} |")
    return "\n".join(lines) + "\n"


def main() -> int:
    import argparse

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--max-tokens", type=int, default=1024)
    ap.add_argument("--write-docs", action="store_true")
    ap.add_argument("--table", action="store_true", help="only print/write from saved results")
    args = ap.parse_args()
    torch.set_num_threads(2)
    res = STORE.load() if args.table else measure(args.max_tokens)
    if not args.table:
        STORE.save(res)
    print(body(res))
    if args.write_docs:
        replace_doc_section(HEADING, body(res), ACCURACY_DOC)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
