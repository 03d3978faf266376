"""GPTQ's cost for `tfcompile plan --estimate`: one solve's seconds and peak working set.

Registered with the algorithm (gptq.py `register_algorithm(cost=COST)`); tfcompile/estimate/plan.py
adds the solves up per rank (in pack, or in calibrate's layer loop with calibrate.propagate) and
names no algorithm. Routed experts solve `quantize.gptq_expert_batch` at a time in one sweep
(gptq_moe.py): `batches_experts`. The figures it uses beyond the shared ones of
tfcompile/estimate/throughputs.py (the Cholesky rate, the FP32 efficiency) are its own, below.
"""

from __future__ import annotations

from typing import Any, Mapping

from tfcompile.estimate.throughputs import ASSUMED
from tfcompile.ir import SolveCost

# One thread (gptq.py `_sweep`), measured here by `python bench/estimate.py --measure` with the rest
# of THIS_MACHINE (tfcompile/estimate/throughputs.py; a TFCOMPILE_THROUGHPUTS file's "gptq_sweep"
# replaces it): the sweep of an [n, K] weight without its factorisations, K a + n K b + n K^2 c,
# fitted on three shapes: a per column (~25 small ops), b per element, c the lazy block updates
SWEEP = {"column_us": 88.0, "element_ns": 244.0, "lazy_ps": 33.0}
# On a GPU one column is ~25 dependent small kernels (launch-bound): ~8 us each from Python.
GPU_COLUMN_US = 200.0


def solve_bytes(n: int, k: int) -> int:
    """Peak working set of one GPTQ solve of an [n, k] weight (gptq.py, fp32): five K x K (the
    Hessian handed in, its act-order permutation, `_inverse_hessian`'s clone, the damping's eye
    and its scaled copy; later the Cholesky factor and inverse, no more than five at once) and six
    N x K (the weight handed in, its fp32 copy and permutation, the fixed multipliers and their
    permutation, the output). Checked: a [1024, 4096] solve allocates 310 MB beyond the Hessian,
    weight and multipliers it is given; this count says 335."""
    return 4 * (5 * k * k + 6 * n * k)


def solve_seconds(n: int, k: int, gpu, m: Mapping[str, Any], together: int = 1) -> float:
    """One GPTQ solve of an [n, k] weight: the three factorisations (4/3 k^3 flops) and the
    column sweep with its lazy block updates (fitted per column, element and n k^2). `together`
    solves share one sweep (a batch of routed experts): each pays 1/together of its per-column
    cost, the launch- or interpreter-bound part. `gpu`: an Accelerator, None on this CPU."""
    if gpu:
        rate = gpu.fp32_tflops * 1e12 * ASSUMED["gpu_fp32_efficiency"]
        return k * GPU_COLUMN_US / 1e6 / together + (4 / 3 * k ** 3 + 2 * n * k * k) / rate
    sw = m.get("gptq_sweep", SWEEP)  # one thread
    return 4 / 3 * k ** 3 / (m["chol_gflops"] * 1e9) + k * sw["column_us"] / 1e6 / together + \
        n * k * sw["element_ns"] / 1e9 + n * k * k * sw["lazy_ps"] / 1e12


COST = SolveCost(solve_seconds, solve_bytes, batches_experts=True)
