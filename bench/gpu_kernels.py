"""GPU kernels: achieved TFLOP/s and GB/s per kernel and shape, against this device's measured
bf16 matmul rate and copy bandwidth, torch baselines, and exhaustive search.

    python bench/gpu_kernels.py [--json] [--quick] [--exhaustive 48]

Needs one CUDA GPU of an emitted target (H100 / H200: sm_90a, B200: sm_100a); without one it
exits 2. Everything runs in this one call (about 5-10 minutes on an H100, mostly compiling):

1. the device: bf16 torch.matmul at 8192^3 (TFLOP/s) and a 1 GiB device copy (GB/s, read +
   write), the ratios' denominators; torch._scaled_mm FP8 at 8192^3 (the measured FP8 peak);
2. every kernel serving each format on this target, at the demo model's and Llama-3-8B's
   Linear shapes x M in {1, 16, 64, 256, 1024, 4096}, with the config `tfcompile tune` picks
   offline (cost model): us, TFLOP/s, GB/s, and ratios to (1); torch.matmul bf16 and
   torch._scaled_mm FP8 on the same shapes;
3. the FP8 GEMM at 8192^3 against the measured FP8 and bf16 peaks;
4. W4A16 at M <= 16 against bf16 torch.matmul (decode: the 3.56x of NVFP4's bytes is the ideal);
5. tuned (cost-model) config vs the best of an exhaustive sweep (--exhaustive configs of the
   pruned space, spread over its ranking) on two Llama shapes;
6. the CUTLASS GEMMs (kernels/cutlass: FP8 on sm_90a, NVFP4 / MXFP4 on sm_100a) with the
   configs the cost model picks, built here with nvcc (cached in $TFCOMPILE_CACHE/cutlass;
   skipped with a warning without nvcc 12.8+), in the same table as the Triton kernels.
Tables go to stderr; --json prints every figure on stdout.
"""

from __future__ import annotations

import argparse
import json
import sys

DEMO = [(256, 256), (128, 256), (768, 256), (256, 768)]  # examples/demo-lm (q, k/v, gate/up, down)
LLAMA3_8B = [(4096, 4096), (14336, 4096), (4096, 14336), (6144, 4096)]  # o, gate/up, down, qkv fused
BUCKETS = (1, 16, 64, 256, 1024, 4096)
SCHEMES = ("fp8", "fp8-dynamic", "fp8-block", "mxfp8", "nvfp4", "nvfp4a16", "mxfp4", "mxfp4a16")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="print every figure as JSON on stdout")
    ap.add_argument("--quick", action="store_true", help="Llama shapes only, M in {1, 16, 4096}")
    ap.add_argument("--exhaustive", type=int, default=48, help="configs per problem in the sweep (0: skip)")
    args = ap.parse_args(argv)
    try:
        import torch
    except ImportError:
        return _no_gpu("torch is not installed")
    if not torch.cuda.is_available():
        return _no_gpu("no CUDA GPU is visible to torch")
    from tfcompile.tune.hardware import get_target, target_of_capability

    target = target_of_capability(*torch.cuda.get_device_capability())
    if target is None:
        return _no_gpu(f"{torch.cuda.get_device_name()} is neither sm_90a (H100/H200) nor sm_100a (B200)")
    shapes = LLAMA3_8B if args.quick else DEMO + LLAMA3_8B
    buckets = (1, 16, 4096) if args.quick else BUCKETS
    report = {"device": torch.cuda.get_device_name(), "target": target, "peaks_vendor": {
        "tflops": dict(get_target(target).peak_tflops), "hbm_tbps": get_target(target).hbm_tbps}}
    report["measured"] = device_rates()
    report["kernels"] = kernel_rows(target, shapes, buckets, report["measured"])
    report["kernels"] += cutlass_rows(target, shapes, buckets, report["measured"])
    report["baselines"] = baseline_rows(shapes, buckets, report["measured"])
    report["fp8_8192"] = fp8_at_8192(target, report["measured"])
    report["w4a16_decode"] = w4a16_vs_bf16(report["kernels"], report["baselines"])
    report["tuned_vs_exhaustive"] = sweep(target, args.exhaustive) if args.exhaustive else []
    print_tables(report)
    if args.json:
        json.dump(report, sys.stdout, indent=2, sort_keys=True)
        sys.stdout.write("\n")
    return 0


def _no_gpu(why: str) -> int:
    sys.stderr.write(f"error: bench/gpu_kernels.py measures GPU kernels and needs an H100/H200/B200: {why}\n"
                     "hint: run it on a GPU machine: python bench/gpu_kernels.py --json > kernels.json\n")
    return 2


def bench_us(fn) -> float:
    import triton.testing

    fn()
    return float(triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median")) * 1e3


def device_rates() -> dict:
    """bf16 matmul TFLOP/s and FP8 _scaled_mm TFLOP/s at 8192^3; copy GB/s (read + write) of 1 GiB."""
    import torch

    n = 8192
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    bf16 = 2 * n ** 3 / bench_us(lambda: a @ b.T) / 1e6
    fp8 = None
    a8, b8, one = a.to(torch.float8_e4m3fn), b.to(torch.float8_e4m3fn), torch.ones((), device="cuda")
    try:
        fp8 = 2 * n ** 3 / bench_us(lambda: torch._scaled_mm(a8, b8.T, one, one, out_dtype=torch.bfloat16)) / 1e6
    except Exception as e:  # noqa: BLE001 - report and go on
        sys.stderr.write(f"warning: torch._scaled_mm failed: {e}\n")
    src = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    copy = 2 * src.numel() / bench_us(lambda: dst.copy_(src)) / 1e3
    return {"bf16_tflops": bf16, "fp8_tflops": fp8, "copy_gbps": copy}


def _row(kind, name, n, k, m, us, flops, nbytes, rates, **extra) -> dict:
    tf, gb = flops / us / 1e6 if us else None, nbytes / us / 1e3 if us else None
    return {"kind": kind, "kernel": name, "n": n, "k": k, "m": m, "us": us, "tflops": tf, "gbps": gb,
            "vs_bf16_matmul": tf / rates["bf16_tflops"] if tf else None,
            "vs_copy": gb / rates["copy_gbps"] if gb else None, **extra}


def kernel_rows(target, shapes, buckets, rates) -> list[dict]:
    """Every kernel serving a scheme here, with its offline-tuned config, on every shape x bucket."""
    from tfcompile.schemes import get_scheme
    from tfcompile.tune.compile import FrontendCheck
    from tfcompile.runtime.measure import runner_factory, time_us
    from tfcompile.tune.registry import load_kernels
    from tfcompile.tune.search import Ranker
    from tfcompile.tune.shapes import problems

    kernels, warnings = load_kernels()
    for w in warnings:
        sys.stderr.write(f"warning: {w}\n")
    ranker, rows, seen = Ranker(check=FrontendCheck()), [], set()
    for scheme in SCHEMES:
        probs, _ = problems(get_scheme(scheme), shapes, (target,), buckets, kernels)
        for p in probs:
            if p in seen:
                continue
            seen.add(p)
            kd = kernels[p.kernel]
            best = ranker.rank(kd, p).best
            try:
                us = time_us(runner_factory(kd, p)(best.config)) if best else None
                err = None if best else "no config fits"
            except Exception as e:  # noqa: BLE001 - one failing kernel must not stop the bench
                us, err = None, f"{type(e).__name__}: {str(e)[:200]}"
            rows.append(_row(kd.kind, kd.name, p.n, p.k, p.m, us, kd.flops(p.m, p.n, p.k),
                             kd.bytes_moved(p.m, p.n, p.k), rates, config=best.config if best else None,
                             predicted_us=best.est.us if best else None, error=err))
            sys.stderr.write(f"{p.key}: {us if us is None else round(us, 2)} us\n")
    return rows


CUTLASS_A = {"fp8": "fp8_gemm_tensor", "fp8-dynamic": "fp8_gemm_channel", "nvfp4": "fp4_gemm_nvfp4",
             "mxfp4": "fp4_gemm_mxfp4"}  # the Triton GEMM whose synthetic A operand (bindings) fits


def cutlass_rows(target, shapes, buckets, rates) -> list[dict]:
    """Each CUTLASS GEMM serving a scheme here, cost-model config per problem, timed like kernel_rows."""
    import tempfile

    from tfcompile.kernels.cutlass.build import Job, build_all
    from tfcompile.kernels.cutlass.configs import KERNELS
    from tfcompile.kernels.cutlass.render import entry_names, render
    from tfcompile.kernels.cutlass.toolchain import detect
    from tfcompile.runtime.cutlass import CutlassLibrary
    from tfcompile.tune import cutlass as tc

    tool = detect()
    if tool.why_not:
        sys.stderr.write(f"warning: CUTLASS kernels not benchmarked: {tool.why_not}\n")
        return []
    version, rows, libs = tc.version(), [], {}
    tmp = tempfile.mkdtemp(prefix="tfcompile-bench-cutlass-")
    for scheme, a_of in CUTLASS_A.items():
        probs, _ = tc.problems(scheme, shapes, (target,), buckets)
        entries, _ = tc.choose(probs, None, version)
        todo = {(p.kernel, e["config"]["id"]): (KERNELS[p.kernel], e["config"])
                for p in probs for e in [entries[tc.entry_key(p, version)]]}
        todo = {key: v for key, v in todo.items() if key not in libs}
        built = build_all([Job(f"{k.name}_{c['id']}", render(k, c), k.arch, k.mma) for k, c in todo.values()], tool)
        for (key, (kdef, cfg)), b in zip(todo.items(), built):
            path = f"{tmp}/{kdef.name}_{cfg['id']}.so"
            with open(path, "wb") as f:
                f.write(b.so)
            libs[key] = CutlassLibrary(path, {"entry": entry_names(kdef, cfg), "abi": {"returns": {}},
                                              "formats": list(kdef.formats), "config": cfg})
        for p in probs:
            cfg = entries[tc.entry_key(p, version)]["config"]
            rows.append(_cutlass_row(libs[(p.kernel, cfg["id"])], KERNELS[p.kernel], scheme, a_of, p, cfg, rates))
    return rows


def _cutlass_row(lib, kdef, scheme, a_of, p, cfg, rates) -> dict:
    import torch

    from tfcompile.runtime.bindings import A_OPERANDS, synthetic_weights
    from tfcompile.runtime.cutlass import gemm_operands
    from tfcompile.schemes import get_scheme

    a, sa = A_OPERANDS[a_of](p.m, p.k, "cuda")
    b, sb, alpha, flags = gemm_operands(synthetic_weights(get_scheme(scheme), p.n, p.k, "cuda"), lib.doc)
    flags |= 1 if (sa is not None and sa.numel() > 1 and not kdef.sf_vec) else 0
    out = torch.empty(p.m, p.n, dtype=torch.bfloat16, device="cuda")
    try:
        us, err = bench_us(lambda: lib.gemm(a, b, sa, sb, alpha, out, p.m, p.n, p.k, flags)), None
    except Exception as e:  # noqa: BLE001 - one failing kernel must not stop the bench
        us, err = None, f"{type(e).__name__}: {str(e)[:200]}"
    sys.stderr.write(f"{p.key} ({scheme}): {us if us is None else round(us, 2)} us\n")
    return _row("cutlass", f"{kdef.name} ({scheme})", p.n, p.k, p.m, us, kdef.flops(p.m, p.n, p.k),
                kdef.bytes_moved(p.m, p.n, p.k), rates, config=cfg, error=err)


def baseline_rows(shapes, buckets, rates) -> list[dict]:
    """torch.matmul bf16 and torch._scaled_mm FP8 (per-tensor scales) on the same shapes."""
    import torch

    rows = []
    for n, k in shapes:
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
        w8, one = w.to(torch.float8_e4m3fn), torch.ones((), device="cuda")
        for m in buckets:
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            rows.append(_row("baseline", "torch.matmul bf16", n, k, m, bench_us(lambda: x @ w.T), 2.0 * m * n * k,
                             2.0 * (m * k + n * k + m * n), rates))
            x8 = x.to(torch.float8_e4m3fn)
            try:
                pad = -m % 16  # _scaled_mm wants M % 16 == 0
                x8p = torch.nn.functional.pad(x8.float(), (0, 0, 0, pad)).to(torch.float8_e4m3fn)
                us = bench_us(lambda: torch._scaled_mm(x8p, w8.T, one, one, out_dtype=torch.bfloat16))
            except Exception:  # noqa: BLE001
                us = None
            rows.append(_row("baseline", "torch._scaled_mm fp8", n, k, m, us, 2.0 * m * n * k,
                             m * k + n * k + 2.0 * m * n, rates))
    return rows


def fp8_at_8192(target, rates) -> dict:
    from tfcompile.tune.compile import FrontendCheck
    from tfcompile.runtime.measure import runner_factory, time_us
    from tfcompile.tune.registry import load_kernels
    from tfcompile.tune.search import Ranker
    from tfcompile.tune.shapes import Problem

    kd = load_kernels()[0].get("fp8_gemm_tensor")
    if kd is None:
        return {"error": "fp8_gemm_tensor is not registered"}
    p = Problem(target, kd.name, 8192, 8192, 8192)
    best = Ranker(check=FrontendCheck()).rank(kd, p).best
    try:
        us = time_us(runner_factory(kd, p)(best.config))
    except Exception as e:  # noqa: BLE001 - report it with the rest
        return {"config": best.config, "error": f"{type(e).__name__}: {str(e)[:200]}"}
    tf = 2 * 8192 ** 3 / us / 1e6
    return {"config": best.config, "us": us, "tflops": tf,
            "vs_measured_fp8_peak": tf / rates["fp8_tflops"] if rates["fp8_tflops"] else None,
            "vs_measured_bf16": tf / rates["bf16_tflops"]}


def w4a16_vs_bf16(kernels: list[dict], baselines: list[dict]) -> list[dict]:
    base = {(r["n"], r["k"], r["m"]): r["us"] for r in baselines if r["kernel"] == "torch.matmul bf16"}
    out = []
    for r in kernels:
        if r["kernel"].startswith("w4a16") and r["m"] <= 16 and r["us"] and base.get((r["n"], r["k"], r["m"])):
            b = base[(r["n"], r["k"], r["m"])]
            out.append({"kernel": r["kernel"], "n": r["n"], "k": r["k"], "m": r["m"], "us": r["us"],
                        "bf16_us": b, "speedup": b / r["us"]})
    return out


def sweep(target, limit: int) -> list[dict]:
    """Tuned config vs the best of `limit` configs spread over the ranking (plus the top 16)."""
    from tfcompile.tune.compile import FrontendCheck
    from tfcompile.runtime.measure import runner_factory, time_us
    from tfcompile.tune.registry import load_kernels
    from tfcompile.tune.search import Ranker
    from tfcompile.tune.shapes import Problem

    kernels = load_kernels()[0]
    name = "fp8_gemm_tensor" if "fp8_gemm_tensor" in kernels else next(iter(kernels), None)
    out = []
    for n, k, m in ((4096, 4096, 16), (14336, 4096, 4096)):
        kd = kernels[name]
        p = Problem(target, name, n, k, m)
        full = Ranker(keep=10 ** 6, check=FrontendCheck()).rank(kd, p).ranked
        step = max(1, len(full) // max(1, limit))
        picks = list(full[:16]) + list(full[16::step])[:limit]
        try:
            make, times = runner_factory(kd, p), []
        except KeyError:  # no binding: cannot be timed
            continue
        for r in picks:
            try:
                times.append((time_us(make(r.config)), r.config))
            except Exception:  # noqa: BLE001 - out of resources on this GPU
                continue
        tuned_us = next((t for t, c in times if c == full[0].config), None)
        best_us, best_cfg = min(times, key=lambda t: t[0]) if times else (None, None)
        out.append({"kernel": name, "n": n, "k": k, "m": m, "configs_timed": len(times), "tuned": full[0].config,
                    "tuned_us": tuned_us, "best": best_cfg, "best_us": best_us,
                    "tuned_vs_best": best_us / tuned_us if tuned_us and best_us else None})
    return out


def print_tables(report: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    con = Console(stderr=True)
    m = report["measured"]
    con.print(f"{report['device']} ({report['target']}): bf16 matmul {m['bf16_tflops']:.0f} TFLOP/s, "
              f"fp8 _scaled_mm {m['fp8_tflops'] or 0:.0f} TFLOP/s, copy {m['copy_gbps']:.0f} GB/s")
    t = Table(title="kernels and baselines")
    for col in ("kernel", "N x K", "M", "us", "TFLOP/s", "x bf16 mm", "GB/s", "x copy"):
        t.add_column(col, justify="left" if col in ("kernel", "N x K") else "right")
    f = lambda v, s=".2f": "-" if v is None else format(v, s)  # noqa: E731
    for r in report["kernels"] + report["baselines"]:
        t.add_row(r["kernel"], f"{r['n']}x{r['k']}", str(r["m"]), f(r["us"]), f(r["tflops"], ".1f"),
                  f(r["vs_bf16_matmul"]), f(r["gbps"], ".0f"), f(r["vs_copy"]))
    con.print(t)
    con.print("fp8 GEMM 8192^3:", report["fp8_8192"])
    for r in report["w4a16_decode"]:
        con.print(f"W4A16 {r['kernel']} {r['n']}x{r['k']} M={r['m']}: {r['speedup']:.2f}x vs bf16 matmul")
    for r in report["tuned_vs_exhaustive"]:
        con.print(f"tuned vs exhaustive {r['kernel']} {r['n']}x{r['k']} M={r['m']}: {r['tuned_vs_best']}")


if __name__ == "__main__":
    sys.exit(main())
