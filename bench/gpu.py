"""Bench: the --device cuda paths on a lent H100/H200/B200, in one run of under 10 minutes.

    pip install -e . && python bench/gpu.py [--write-docs]     # exits 2 without a GPU

1. Calibration of the synthetic 1.1B Llama (bench/estimate.py's, 16 layers) on 8 x 256
   random tokens, layer by layer, on the CPU and on the GPU (calibration.sequential with
   device=cpu / cuda): every observer amax and every Hessian must agree within fp32 tolerance
   (amax: relative 1e-2 -- bf16 activations computed by different kernels; Hessians:
   relative Frobenius error 1e-2), wall time of each.
2. `tfcompile quantize --format nvfp4a16 --device cuda` vs `--device cpu` (RTN): the
   artifacts must be identical byte for byte (the packed bytes are encoded on the CPU).
   `--format nvfp4` (calibrated) on both devices: weight tensors identical, input scales
   within 1e-2.
3. GPTQ on the GPU: `tfcompile quantize --format nvfp4a16 --algorithm gptq --device cuda` on
   the 4-layer model of the same widths: calibrate and pack seconds, next to what
   `plan --estimate --devices 1x<GPU>` predicts.
4. `python bench/gpu_kernels.py --quick --json`.
5. The AWQ scale search (passes/quantize/awq.py `search`) on one synthetic fusion group
   (K 2048, members 3 x 2048 rows, 1024 input rows with outlier channels) with device=cuda vs
   cpu, for nvfp4a16, nvfp4 (static activation scales) and mxfp4: the same alpha and s (the
   CPU re-scores the near-best), and the largest relative difference between the GPU's and
   the CPU's losses over the 21 alphas (TIE_RTOL is 1e-3).

Results: /tmp/tfc-bench-gpu/gpu.json, and with --write-docs the section "GPU run
(bench/gpu.py)" of docs/performance.md.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from common import REPO, git_revision, machine_line, replace_doc_section  # noqa: E402
from estimate import CALIB, SHAPE_1B  # noqa: E402
from quantize import make_checkpoint, tfcompile_argv  # noqa: E402

WORK = Path("/tmp/tfc-bench-gpu")
HEADING = "## GPU run (bench/gpu.py)"


DEV = "cuda"  # --dry-run: "cpu", to check this script's own code without a GPU


def _calibrate(model: Path, device: str) -> tuple[object, float]:
    import torch

    from tfcompile.calibration.hessian import NAME as HESSIAN
    from tfcompile.calibration.sequential import observe_sequential
    from tfcompile.io.checkpoint import open_checkpoint

    ckpt = open_checkpoint(model)
    mods = {n.removesuffix(".weight") for n in ckpt.names() if ".layers." in n and n.endswith("proj.weight")}
    groups = {m: m for m in mods if m.endswith(("q_proj", "o_proj", "gate_proj", "down_proj"))}
    t0 = time.perf_counter()
    stats = observe_sequential(model, ckpt, mods, data="random", samples=8, seq_len=256, seed=0,
                               dtype=torch.bfloat16, statistics={HESSIAN: {}}, groups=groups, batch=4,
                               device=device)
    if device != "cpu":
        torch.cuda.synchronize(device)
    return stats, time.perf_counter() - t0


def check_calibration(model: Path) -> dict:
    import torch

    cpu, t_cpu = _calibrate(model, "cpu")
    gpu, t_gpu = _calibrate(model, DEV)
    amax_err = max(abs(gpu.input_amax[m] - v) / v for m, v in cpu.input_amax.items())
    from tfcompile.calibration.hessian import hessians

    hc, hg = hessians(cpu), hessians(gpu)
    h_err = max(float(torch.linalg.norm(hg[k].float() - hc[k].float()) / torch.linalg.norm(hc[k].float()))
                for k in hc)
    return {"cpu_s": round(t_cpu, 2), "gpu_s": round(t_gpu, 2), "amax_max_rel_err": amax_err,
            "hessian_max_rel_err": h_err, "ok": amax_err <= 1e-2 and h_err <= 1e-2}


def _quantize(model: Path, out: Path, *opts: str) -> dict:
    doc = subprocess.run([*tfcompile_argv(), "quantize", str(model), "-o", str(out), "--overwrite", *opts,
                          "--json", "-q"], capture_output=True, text=True, check=True).stdout
    return json.loads(doc)


def check_packed(model: Path) -> dict:
    import torch
    from safetensors.torch import load_file

    def tensors(d: Path) -> dict:
        return {k: v for f in sorted(d.glob("*.safetensors")) for k, v in load_file(f).items()}

    out = {}
    for fmt in ("nvfp4a16", "nvfp4"):
        opts = ["--format", fmt] + (CALIB if fmt == "nvfp4" else [])
        _quantize(model, WORK / f"{fmt}-cpu", *opts, "--device", "cpu")
        _quantize(model, WORK / f"{fmt}-cuda", *opts, "--device", DEV)
        a, b = tensors(WORK / f"{fmt}-cpu"), tensors(WORK / f"{fmt}-cuda")
        weights_equal = all(torch.equal(a[k], b[k]) for k in a if "input" not in k)
        scale_err = max((float((a[k].float() - b[k].float()).abs().max() / a[k].float().abs().max())
                         for k in a if "input" in k), default=0.0)
        out[fmt] = {"weights_identical": weights_equal, "input_scale_max_rel_err": scale_err,
                    "ok": weights_equal and scale_err <= 1e-2}
    return out


def gptq_on_gpu(gpu_kind: str, shape: dict, layers: int) -> dict:
    model = make_checkpoint(WORK / f"gptq-{layers}", 0, shape=shape, layers=layers)
    opts = ["--format", "nvfp4a16", "--algorithm", "gptq", *CALIB]
    t0 = time.perf_counter()
    doc = _quantize(model, WORK / "gptq-cuda", *opts, "--device", DEV)
    wall = time.perf_counter() - t0
    est = json.loads(subprocess.run([*tfcompile_argv(), "plan", str(model), *opts, "--estimate", "--devices",
                                     f"1x{gpu_kind}", "--json"], capture_output=True, text=True, check=True).stdout)
    return {"wall_s": round(wall, 2), "calibrate_s": doc["passes"]["calibrate"]["seconds"],
            "pack_s": doc["passes"]["pack"]["seconds"],
            "solve_s_per_layer": doc["passes"]["pack"].get("solve_seconds_per_layer"),
            "estimate": {"calibrate_s": est["passes"]["calibrate"]["seconds"], "pack_s": est["passes"]["pack"]["seconds"]}}


def kernels_quick() -> dict:
    p = subprocess.run([sys.executable, str(REPO / "bench" / "gpu_kernels.py"), "--quick", "--json"],
                       capture_output=True, text=True)
    return {"rc": p.returncode, "result": json.loads(p.stdout) if p.returncode == 0 and p.stdout.strip() else None,
            "stderr_tail": p.stderr[-2000:]}


def awq_search(k: int = 2048, rows: int = 1024) -> dict:
    """Item 5 of the module docstring."""
    import torch

    from tfcompile.calibration.awq_stats import AWQInput
    from tfcompile.ir import Program, QuantTarget
    from tfcompile.passes.quantize import awq
    from tfcompile.schemes import get_scheme

    g = torch.Generator().manual_seed(0)
    ws = [(torch.randn(k, k, generator=g) * 0.02).bfloat16().float() for _ in range(3)]
    x = torch.randn(rows, k, generator=g)
    x[:, torch.randperm(k, generator=g)[:32]] *= 20.0  # outlier channels, as LLM activations have
    st = AWQInput("norm", x.abs().mean(0), x.abs().amax(0), x, rows)
    members = tuple(QuantTarget(f"m{i}", f"m{i}.weight", None, None, (k, k)) for i in range(3))
    norm_w = torch.ones(k, dtype=torch.bfloat16)
    out = {}
    for fmt in ("nvfp4a16", "nvfp4", "mxfp4"):
        prog = Program(get_scheme(fmt), "awq", (), {}, "floor", 16)
        args = (st, norm_w, ws, members, prog, torch.bfloat16)
        t0 = time.perf_counter()
        cpu = awq.search(*args, device="cpu")[0]
        t1 = time.perf_counter()
        dev = awq.search(*args, device=DEV)[0]
        t2 = time.perf_counter()
        cands = [awq.fold_norm(norm_w, awq.awq_scales(st.mean_abs, a))[1] for a in awq.GRID]
        score_c, score_d = (awq.scorer(st, ws, members, prog, torch.bfloat16, d) for d in ("cpu", DEV))
        amax = float(st.max_abs.max())
        rel = max(abs(score_d(s, amax) - score_c(s, amax)) / score_c(s, amax) for s in cands)
        same = dev.alpha == cpu.alpha and torch.equal(dev.s, cpu.s)
        out[fmt] = {"alpha": cpu.alpha, "same_fold": same, "loss_max_rel_diff": rel,
                    "cpu_s": round(t1 - t0, 2), "gpu_s": round(t2 - t1, 2), "ok": same}
    return out


def _markdown(doc: dict) -> str:
    c, p, g = doc["calibration"], doc["packed"], doc["gptq"]
    return "\n".join([
        f"`python bench/gpu.py --write-docs` on {doc['gpu']} ({machine_line()}, commit {git_revision()}).",
        "", f"- Calibration, 1.1B synthetic, 8 x 256 tokens, layer by layer: CPU {c['cpu_s']} s, GPU {c['gpu_s']} s; "
        f"max relative amax difference {c['amax_max_rel_err']:.2e}, Hessians {c['hessian_max_rel_err']:.2e} "
        f"({'ok' if c['ok'] else 'FAILED'}).",
        f"- RTN nvfp4a16 with --device cuda vs cpu: weights identical {p['nvfp4a16']['weights_identical']}; "
        f"calibrated nvfp4: weights identical {p['nvfp4']['weights_identical']}, input scales within "
        f"{p['nvfp4']['input_scale_max_rel_err']:.2e}.",
        f"- GPTQ (4 layers of the 1.1B widths) on the GPU: calibrate {g['calibrate_s']} s (estimate "
        f"{g['estimate']['calibrate_s']} s), pack with solves {g['pack_s']} s (estimate {g['estimate']['pack_s']} s).",
        "- AWQ search, one K=2048 group, GPU vs CPU: " + "; ".join(
            f"{f} same fold {a['same_fold']} (alpha {a['alpha']}), losses within {a['loss_max_rel_diff']:.1e}, "
            f"{a['gpu_s']} s vs {a['cpu_s']} s" for f, a in doc["awq"].items()) + ".",
        f"- bench/gpu_kernels.py --quick: exit {doc['kernels']['rc']} (figures in /tmp/tfc-bench-gpu/gpu.json).", ""])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--write-docs", action="store_true")
    ap.add_argument("--dry-run", action="store_true", help="no GPU: 'cuda' is the CPU and the model is tiny "
                    "(checks this script, not the GPU; never writes docs)")
    args = ap.parse_args()
    import torch

    global DEV
    shape, layers = SHAPE_1B, 16
    if args.dry_run:
        DEV, shape, layers, args.write_docs = "cpu", dict(hidden=256, intermediate=512, heads=4, kv_heads=2,
                                                          vocab=1024), 2, False
    elif not torch.cuda.is_available():
        print("error: no CUDA device (this bench needs a GPU; docs/performance.md says what ran without one)",
              file=sys.stderr)
        sys.exit(2)
    WORK.mkdir(parents=True, exist_ok=True)
    name = torch.cuda.get_device_name() if DEV == "cuda" else "none (--dry-run)"
    kind = next((k for k in ("B200", "H200", "H100") if k in name), "H100")
    t0 = time.perf_counter()
    model = make_checkpoint(WORK / f"llama-{layers}", 0, shape=shape, layers=layers)
    doc = {"gpu": name, "calibration": check_calibration(model), "packed": check_packed(model),
           "gptq": gptq_on_gpu(kind, shape, max(1, layers // 4)),
           "awq": awq_search(*((256, 256) if args.dry_run else ())), "kernels": kernels_quick()}
    doc["seconds"] = round(time.perf_counter() - t0, 1)
    (WORK / "gpu.json").write_text(json.dumps(doc, indent=2, default=str))
    print(json.dumps({k: v for k, v in doc.items() if k != "kernels"}, indent=2, default=str))
    if args.write_docs:
        print(replace_doc_section(HEADING, _markdown(doc)), file=sys.stderr)
    ok = doc["calibration"]["ok"] and all(v["ok"] for v in [*doc["packed"].values(), *doc["awq"].values()])
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
