"""How far apart are equally valid NVFP4 RTN quantizations of a model on the held-out text?

Two RTN implementations that follow the same rule can still differ in the last bit of a global
scale (float32 division order, a bf16 round trip), and each such difference re-rounds many
elements. This bench quantizes every decoder Linear of a model (SmolLM2-135M-Instruct by default; `--model
demo-lm | demo-gemma | DIR`) with NVFP4 RTN (fused q/k/v and gate/up sharing one global scale,
as tfcompile and llm-compressor both do) under the global scale g = 2688 / amax as computed,
rounded to bf16, and nudged by 1 + 2^-10, 1 - 2^-10 and 1 + 2^-8, and scores each (weights
only, bf16) on the held-out tokens with bench/heldout.py. The spread is the noise floor of any
RTN-to-RTN comparison (bench/peers.py); the last line prints it as (max - min) / bf16 perplexity.

    python -m bench run acc_rtn_spread [--max-tokens 8192] [--model demo-gemma]

Results: $TFCOMPILE_CACHE/bench/smollm2-rtn-spread.json (other models: <model>-rtn-spread-<tokens>.json).
"""

from __future__ import annotations

from pathlib import Path

import torch

from bench.heldout import HeldOut, Results, bench_parser  # noqa: E402

STORE = Results("smollm2-rtn-spread")
FUSED = {"q_proj": "qkv", "k_proj": "qkv", "v_proj": "qkv", "gate_proj": "gate_up", "up_proj": "gate_up"}
# label -> (factor on the global scale, round the global scale to bf16 first)
VARIANTS = {"g": (1.0, False), "g_bf16": (1.0, True), "g*(1+2^-10)": (1 + 2 ** -10, False), "g*(1-2^-10)": (1 - 2 ** -10, False),
            "g*(1+2^-8)": (1 + 2 ** -8, False)}


def groups(model: torch.nn.Module) -> dict[str, list[str]]:
    """Fusion group key -> its decoder Linears (q/k/v and gate/up fused, the rest alone)."""
    out: dict[str, list[str]] = {}
    for name, mod in model.named_modules():
        if isinstance(mod, torch.nn.Linear) and ".layers." in name:
            parent, leaf = name.rsplit(".", 1)
            out.setdefault(f"{parent}.{FUSED.get(leaf, leaf)}", []).append(name)
    return out


def main() -> int:
    ap = bench_parser(__doc__)
    ap.add_argument("--model", default="smollm2", help="smollm2 (default) | demo-lm | demo-gemma | a checkpoint dir")
    args = ap.parse_args()
    store = STORE if args.model == "smollm2" else Results(f"{Path(args.model).name}-rtn-spread-{args.max_tokens}")
    results = store.load() if args.table else measure(args.max_tokens, args.model, store)
    for label, r in results.items():
        print(f"{label:14s} KL {r['kl_mean']:.5f}  ppl {r['perplexity']:.3f}  top-1 {r['top1_agreement']:.4f}")
    ppl = [r["perplexity"] for r in results.values()]
    ref = next(iter(results.values()), {}).get("reference_perplexity")
    if ppl and ref:
        print(f"bf16 {ref:.3f}; RTN perplexity {min(ppl):.3f}-{max(ppl):.3f} over {len(ppl)} global scales: "
              f"spread {100 * (max(ppl) - min(ppl)) / ref:.2f}% of bf16's perplexity")
    return 0


def model_path(name: str) -> Path:
    from tfcompile.fixtures.smollm2 import smollm2_checkpoint

    if name == "smollm2":
        return smollm2_checkpoint()
    p = Path(__file__).resolve().parents[2] / "examples" / name
    return p if p.is_dir() else Path(name)


def measure(max_tokens: int, model: str = "smollm2", store: Results = STORE) -> dict:
    from transformers import AutoModelForCausalLM

    from tfcompile.kernels import formats as F

    path = model_path(model)
    held = HeldOut(path, max_tokens=max_tokens, dtype="bfloat16")
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16).eval()
    mods = dict(model.named_modules())
    orig = {n: mods[n].weight.data.clone() for names in groups(model).values() for n in names}
    results = {}
    for label, (factor, bf16) in VARIANTS.items():
        for names in groups(model).values():
            amax = torch.stack([orig[n].float().abs().amax() for n in names]).amax()
            g = F.nvfp4_global_scale(amax.reshape(1)) * factor
            g = g.to(torch.bfloat16).float() if bf16 else g
            for n in names:
                q = F.quantize_nvfp4(orig[n], global_scale=g)
                mods[n].weight.data = F.dequantize(q, torch.float32).to(torch.bfloat16)
        r = held.score(model)
        results[label] = {k: r[k] for k in ("kl_mean", "perplexity", "top1_agreement", "reference_perplexity")}
        store.save(results)
    return results


if __name__ == "__main__":
    raise SystemExit(main())
