"""The tuning problems of an artifact: (target, kernel, N, K, M bucket).

A quantized Linear [N, K] (out_features, in_features; manifest "layers") runs
as a GEMM y[M, N] = x[M, K] @ W[N, K]^T with M = tokens in flight. M is not
known ahead of time, so each shape is tuned for a few M buckets from decode
(1) to prefill (4096); the runtime takes the smallest bucket >= M (else the
largest). Activation-quantization kernels depend on K only: their problems
have N = 0.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Mapping

from tfcompile.errors import RecipeError
from tfcompile.schemes import Scheme
from tfcompile.tune.registry import Serving, serving

DEFAULT_BUCKETS = (1, 16, 64, 256, 1024, 4096)


@dataclass(frozen=True, order=True)
class Problem:
    target: str  # "sm_90a" | "sm_100a"
    kernel: str  # registered kernel name
    n: int  # out_features (0 for activation-quant kernels)
    k: int  # in_features
    m: int  # M bucket: rows of x

    @property
    def key(self) -> str:
        """The tuning-table key (the triton version is added by the table)."""
        return f"{self.kernel}:{self.target}:{self.n}x{self.k}:m{self.m}"

    @property
    def stem(self) -> str:
        """Emitted file path without suffix: kernels/<target>/<kernel>_<N>x<K>_m<M>
        (activation-quant kernels, which depend on K only: <kernel>_k<K>_m<M>)."""
        shape = f"{self.n}x{self.k}" if self.n else f"k{self.k}"
        return f"kernels/{self.target}/{self.kernel}_{shape}_m{self.m}"


def layer_shapes(layers: Iterable[Mapping]) -> dict[str, list[tuple[int, int]]]:
    """Manifest layers -> weight format -> distinct (N, K), sorted."""
    out: dict[str, set] = {}
    for la in layers:
        n, k = (int(v) for v in la["shape"])
        out.setdefault(la["format"], set()).add((n, k))
    return {f: sorted(s) for f, s in sorted(out.items())}


def bucket_for(m: int, buckets: Iterable[int]) -> int:
    """The smallest bucket >= m, else the largest."""
    b = sorted(buckets)
    return next((x for x in b if x >= m), b[-1])


def check_buckets(buckets: Iterable[int]) -> tuple[int, ...]:
    out = tuple(sorted({int(b) for b in buckets}))
    if not out or out[0] < 1:
        raise RecipeError(f"M buckets must be positive integers, got {list(buckets)}",
                          hint="e.g. --set emit.buckets=[1,16,64,256,1024,4096]")
    return out


def problems(scheme: Scheme, shapes: Iterable[tuple[int, int]], targets: Iterable[str],
             buckets: Iterable[int], kernels: Mapping,
             only: Iterable[str] = ()) -> tuple[list[Problem], dict[str, Serving]]:
    """Every (target, kernel, N, K, bucket) to tune for `scheme` over `shapes`; also the
    kernels serving each target. `only` restricts to the named kernels."""
    shapes, only = sorted(set(shapes)), set(only)
    out: set[Problem] = set()
    served: dict[str, Serving] = {}
    for target in targets:
        s = serving(scheme, target, kernels)
        if only:
            s = Serving(tuple(g for g in s.gemm if g in only), tuple(a for a in s.act_quant if a in only),
                        s.note, s.warn)
        served[target] = s
        for m in buckets:
            for n, k in shapes:
                out.update(Problem(target, g, n, k, m) for g in s.gemm)
                out.update(Problem(target, a, 0, k, m) for a in s.act_quant)
    return sorted(out), served
