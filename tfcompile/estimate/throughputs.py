"""Every number `tfcompile plan --estimate` uses, each with where it comes from.

- ACCELERATORS: published per-GPU figures (vendor datasheets; the H100/B200 bf16 peaks are
  the tuner's, tfcompile/tune/hardware.py, so the two never disagree).
- NODES: the machines they come in (DGX datasheets) and the storage/network figures that are
  our assumptions, said as such.
- THIS_MACHINE: throughputs measured here by `python bench/estimate.py --measure` (the bench
  prints this dict; the date and machine are in docs/performance.md "Resource estimates").
- ASSUMED: efficiencies that no datasheet gives (fraction of a peak reached), with a reason.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from tfcompile.settings import settings
from tfcompile.tune.hardware import TARGETS

_H100 = "NVIDIA H100 Tensor Core GPU datasheet (SXM5)"
_H200 = "NVIDIA H200 Tensor Core GPU datasheet (SXM): 141 GB HBM3e, 4.8 TB/s; compute as H100 SXM"
_B200 = "NVIDIA DGX B200 datasheet: 1,440 GB HBM3e over 8 GPUs, 64 TB/s; HGX B200: 600 TFLOPS FP32 per 8 GPUs"
_DGX_H = "NVIDIA DGX H100/H200 datasheet: 2x Xeon Platinum 8480C (112 cores), 2 TB RAM, 8x 3.84 TB NVMe, " \
         "8x 400 Gb/s ConnectX-7"
_DGX_B = "NVIDIA DGX B200 datasheet: 2x Xeon Platinum 8570 (112 cores), 2 TB RAM (4 TB option), " \
         "8x 3.84 TB NVMe, 8x 400 Gb/s ConnectX-7"


@dataclass(frozen=True)
class Accelerator:
    name: str
    memory_gb: float  # HBM per GPU (GB = 1e9 bytes)
    hbm_tbps: float
    bf16_tflops: float  # dense tensor-core peak
    fp32_tflops: float  # non-tensor FP32 (Hessians and solves stay FP32: TF32 is off)
    h2d_gbps: float  # host -> device copy, PCIe Gen5 x16 per direction
    nvlink_gbps: float  # GPU <-> GPU in a node, per direction
    source: str


ACCELERATORS = {
    "H100": Accelerator("H100 SXM5 80GB", 80, 3.35, TARGETS["sm_90a"].peak_tflops["bf16"], 67.0, 64.0, 450.0,
                        _H100 + ": 989 TFLOPS BF16 dense, 67 TFLOPS FP32, NVLink 900 GB/s, PCIe Gen5 128 GB/s"),
    "H200": Accelerator("H200 SXM 141GB", 141, 4.8, TARGETS["sm_90a"].peak_tflops["bf16"], 67.0, 64.0, 450.0,
                        _H200),
    "B200": Accelerator("B200 180GB", 180, 8.0, TARGETS["sm_100a"].peak_tflops["bf16"], 75.0, 64.0, 900.0,
                        _B200 + "; NVLink 5 1.8 TB/s per GPU"),
}


@dataclass(frozen=True)
class Node:
    accelerators: int
    cpu_cores: int
    ram_gb: float
    disk_read_gbps: float  # local NVMe, whole node (assumption: half the drives' sequential rate)
    disk_write_gbps: float
    network_gbps: float  # between nodes, per GPU (400 Gb/s = 50 GB/s line rate)
    source: str


NODES = {
    "H100": Node(8, 112, 2000, 25.0, 12.0, 50.0, _DGX_H),
    "H200": Node(8, 112, 2000, 25.0, 12.0, 50.0, _DGX_H),
    "B200": Node(8, 112, 2000, 25.0, 12.0, 50.0, _DGX_B),
}

# Measured on this machine (2 vCPUs, no GPU) by `python bench/estimate.py --measure`, medians of
# 5, on 2026-12-01 16:44 UTC while other jobs kept the load average near 12 (two other processes
# busy on the two cores: these are what a busy 2-core CI box gives; an idle one is faster). One
# thread unless it says "all threads".
THIS_MACHINE = {
    "cpu_cores": 2,
    "ram_gb": 24,
    "bf16_gemm_gflops": 234.0,  # all threads: bf16 [2048 x 2048] @ [2048 x 8192] (a layer's forward GEMM)
    "fp32_gemm_gflops": 61.1,  # all threads: fp32 X^T X, X [2048 x 2048] (a Hessian update)
    "attn_gflops": 33.4,  # all threads: torch SDPA, bf16, causal, 4 x 32 heads x 256 x 64
    # all threads: a decoder layer's other calibration work (two RMSNorms, RoPE, SiLU * up, residual
    # adds, the 7 max observers), timed on its own, per token per (4 x hidden + 3 x intermediate)
    # elements; many small ops, each an OpenMP region: under load they wait on a busy core
    "elementwise_ns": 16.4,
    # a whole round-to-nearest pack pass (fused quantizers, writer thread, source sha256) as fixed seconds +
    # GB of bf16 source per second, fitted on a 0.25 and a 0.62 GB model
    "pack_setup_s": 0.42,
    "pack_gbps": 0.91,
    "calibrate_setup_s": 4.1,  # the layer loop's fixed cost (transformers, model on meta, tokens, hooks)
    "calibrate_rss_gb": 0.56,  # that process's RSS: the calibrate pass's baseline
    "sha256_gbps": 1.33,  # one thread
    "read_gbps": 2.99,  # a cold read (posix_fadvise DONTNEED first), 8 MiB reads
    "write_gbps": 2.2,  # O_DIRECT through the 8 MiB staging buffer (docs/design.md "Streaming")
    "chol_gflops": 33.5,  # one thread: cholesky, cholesky_inverse, cholesky of a 2048 x 2048 (4/3 K^3)
    # one thread: quantize.scale_search=output scoring one candidate rounding of a [2048, 2048] NVFP4 weight
    # (its 4 block-scale codes in the search kernel, kernels/formats/block_search.py), ns per weight; measured
    # 2026-12-07 on an idle 2-vCPU Xeon (family 6 model 167), not under the load above (75.2 with torch
    # ops, 4.7 with the kernel's first version), docs/performance.md "Issue 32: the output-scale search
    # as a kernel"
    "scale_search_ns": 3.6,
    # (an algorithm's own figures, measured with these, sit in its cost module under passes/quantize/,
    # registered with it: `register_algorithm(cost=...)`; a TFCOMPILE_THROUGHPUTS file may replace them)
    "base_rss_gb": 0.29,  # python + torch + transformers + tfcompile imported, before the first pass
    "gloo_gbps": 1.0,  # loopback gloo p2p between two processes (assumed, not measured)
}


def this_machine() -> dict:
    """THIS_MACHINE, with the figures of TFCOMPILE_THROUGHPUTS (a JSON file, as `bench/estimate.py
    --measure` prints) in place of the committed ones: the bench compares runs against
    throughputs measured minutes before, under the same load."""
    path = settings().throughputs
    return {**THIS_MACHINE, **(json.loads(path.read_text()) if path else {})}


ASSUMED = {
    # A decoder layer's forward in calibration batches (4 x 512 tokens) reaches ~40% of the bf16
    # tensor-core peak: GEMMs of M = 2048 rows plus norms, RoPE and attention at low intensity.
    "gpu_forward_efficiency": 0.40,
    "gpu_fp32_efficiency": 0.60,  # X^T X and Cholesky on the FP32 pipes
    "link_efficiency": 0.8,  # of NVLink / InfiniBand line rate for the replayed activations
    "sync_ms": 2.0,  # one round of store barriers and metadata exchange between ranks
    "host_copy_gbps": 10.0,  # host memory bandwidth for one process's tensor copies
    # quantize.scale_search=output spreads a group's candidates over the rank's cores
    # (output_scales.search_workers): 2 threads gave 1.70x one thread on this machine (a SmolLM2-sized
    # pair of [2048, 2048] weights in the search kernel, idle, medians of 4, 2026-12-07; 1.78x in a run
    # of the kernel's first version); more threads assumed to keep that efficiency
    "search_thread_efficiency": 0.85,
}
