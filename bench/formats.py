"""Throughput of quantize+pack per format (GB/s of bf16 input) vs a plain copy.

    python bench/formats.py                 # 4096x14336 bf16, 1 and 2 threads
    python bench/formats.py --rules         # also: MX floor vs ceil SQNR table
    python bench/formats.py --reference     # also: the plain-torch reference (slow)

Copy baseline: `dst.copy_(w)` into a preallocated bf16 tensor of the same
shape, timed in the same run. Each figure is the median of --runs timed runs
after one warm-up; quantizer timings include allocating their outputs.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import tempfile
import time

import torch


def median_s(fn, runs: int) -> float:
    fn()  # warm-up (page-faults the allocator, loads the kernel library)
    ts = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def kernel_build_seconds() -> float | None:
    """Cold build of the fused-kernel library (fresh cache dir), in a subprocess."""
    import subprocess
    import sys
    with tempfile.TemporaryDirectory() as tmp:
        code = ("import time;t=time.perf_counter();from tfcompile.kernels.formats import _native as n;"
                "ok=n.lib() is not None;print(time.perf_counter()-t if ok else -1)")
        out = subprocess.run([sys.executable, "-c", code], env={**os.environ, "TFCOMPILE_CACHE": tmp},
                             capture_output=True, text=True, check=True).stdout.strip()
    v = float(out)
    return None if v < 0 else v


def cases():
    from tfcompile.kernels import formats as F
    return {
        "fp8 tensor": lambda w, i: F.quantize_fp8(w, "tensor", impl=i),
        "fp8 channel": lambda w, i: F.quantize_fp8(w, "channel", impl=i),
        "fp8 block128": lambda w, i: F.quantize_fp8(w, "block", impl=i),
        "mxfp8": lambda w, i: F.quantize_mxfp8(w, impl=i),
        "mxfp4": lambda w, i: F.quantize_mxfp4(w, impl=i),
        "nvfp4": lambda w, i: F.quantize_nvfp4(w, impl=i),
    }


def throughput(w: torch.Tensor, threads: list[int], runs: int, reference: bool) -> None:
    gb = w.numel() * w.element_size() / 1e9
    dst = torch.empty_like(w)
    impls = ["auto"] + (["reference"] if reference else [])
    print(f"\n| format | impl | threads | ms | GB/s | ratio vs copy |\n|---|---|---|---|---|---|")
    for nt in threads:
        torch.set_num_threads(nt)
        copy_s = median_s(lambda: dst.copy_(w), runs)
        print(f"| copy (baseline) | torch | {nt} | {copy_s * 1e3:.1f} | {gb / copy_s:.2f} | 1.00 |")
        for name, fn in cases().items():
            for impl in impls:
                s = median_s(lambda: fn(w, impl), runs if impl == "auto" else 1)
                print(f"| {name} | {impl} | {nt} | {s * 1e3:.1f} | {gb / s:.2f} | {copy_s / s:.2f} |")


def rules_table() -> None:
    """MX shared-exponent rules: quantize-dequantize SQNR (dB), 2048x4096 bf16."""
    from tfcompile.kernels import formats as F
    g = torch.Generator().manual_seed(0)

    def student_t(df):
        z = torch.randn(2048, 4096, generator=g)
        chi = sum(torch.randn(2048, 4096, generator=g) ** 2 for _ in range(df))
        return z / torch.sqrt(chi / df)

    dists = {"gaussian": torch.randn(2048, 4096, generator=g), "student-t df=3": student_t(3),
             "student-t df=5": student_t(5)}
    print("\n| weights | MXFP4 floor | MXFP4 ceil | MXFP8 floor | MXFP8 ceil |\n|---|---|---|---|---|")
    for name, w in dists.items():
        w = w.bfloat16()
        row = []
        for q in (F.quantize_mxfp4, F.quantize_mxfp8):
            for rule in ("floor", "ceil"):
                err = (F.dequantize(q(w, rule=rule)) - w.float()).double()
                row.append(10 * torch.log10((w.double() ** 2).sum() / (err ** 2).sum()).item())
        print(f"| {name} | " + " | ".join(f"{v:.2f}" for v in row) + " |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", default="4096x14336")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--reference", action="store_true")
    ap.add_argument("--rules", action="store_true")
    a = ap.parse_args()
    build = kernel_build_seconds()
    from tfcompile.kernels.formats import _native
    print(f"machine: {platform.machine()} {platform.processor() or ''} {os.cpu_count()} CPUs; "
          f"torch {torch.__version__}; cpu capability {torch.backends.cpu.get_cpu_capability()}")
    print(f"fused kernels: {'on' if _native.lib() is not None else 'OFF (reference fallback)'}; "
          f"first-call build (cold cache, compile + load): "
          f"{'n/a' if build is None else f'{build:.2f} s'}")
    n, k = (int(v) for v in a.shape.split("x"))
    w = torch.randn(n, k, generator=torch.Generator().manual_seed(0)).bfloat16()
    print(f"weight: {n}x{k} bf16 = {w.numel() * 2 / 1e6:.0f} MB; median of {a.runs} runs")
    throughput(w, [int(t) for t in a.threads.split(",")], a.runs, a.reference)
    if a.rules:
        rules_table()


if __name__ == "__main__":
    main()
