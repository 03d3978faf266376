"""The block-scale search kernel (kernels/formats/block_search.py, C in _csrc_search) equals its
plain-torch reference bit for bit on every vector path this CPU runs, and that reference does
what its docstring says: checked against a float64 oracle written here from the formats' own
rules (NVFP4: e4m3(amax / 6 * g) and code steps; MXFP4: the shared exponent and E8M0 steps).
"""

from __future__ import annotations

import pytest
import torch

from tfcompile.errors import FormatError
from tfcompile.kernels.formats import _native, block_search as bs, decode_e2m1, fast, mx_shared_exponent, unpack_fp4

from fmt_oracles import DTYPES
from test_fast import _paths, make

pytestmark = pytest.mark.skipif(not fast.available(torch.zeros(1)), reason="no C compiler: fast path off")
NV, MX = (0, 1, -1, -2), (0, 1, -1)


def _hessian_blocks(k: int, blk: int, seed: int) -> torch.Tensor:
    """Diagonal blocks of X^T X / n for correlated inputs with a few large channels (H far from I)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(256, k, generator=g) @ (torch.randn(k, k, generator=g) / k ** 0.5 + torch.eye(k))
    x[:, :3] *= 30.0
    h = x.T @ x / 256
    return torch.stack([h[i:i + blk, i:i + blk] for i in range(0, k, blk)])


def _case(blk: int, n: int, k: int, dtype, seed: int):
    w = make((n, k), dtype, seed, spread=1.0) * 1e-3
    a = bs.tri(_hessian_blocks(k, blk, seed))
    g = torch.tensor([2688 / float(w.float().abs().max())]) if blk == 16 else None
    return w, a, g


@pytest.mark.parametrize("isa", _paths() if fast.available(torch.zeros(1)) else [])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("blk, rule", [(16, None), (32, "floor"), (32, "ceil")])
@pytest.mark.parametrize("n, k", [(37, 256), (16, 64), (5, 96)])  # row tails, one vector's rows, few blocks
def test_kernel_equals_reference(isa, dtype, blk, rule, n, k):
    if k % blk:
        pytest.skip("K not a multiple of the block")
    w, a, g = _case(blk, n, k, dtype, seed=n + k)
    offs = NV if blk == 16 else MX
    ref = bs.search_blocks(w, a, g=g, rule=rule, offsets=offs, impl="reference")
    with _native.use(isa):
        got = bs.search_blocks(w, a, g=g, rule=rule, offsets=offs, impl="fast")
        fixed = bs.search_blocks(w, a, g=g, rule=rule, fixed=ref[1], impl="fast")
    for x, y in zip(ref, got):
        assert x.dtype == y.dtype and torch.equal(x, y)
    ref_fixed = bs.search_blocks(w, a, g=g, rule=rule, fixed=ref[1], impl="reference")
    assert all(torch.equal(x, y) for x, y in zip(ref_fixed, fixed))
    assert torch.equal(fixed[1], ref[1]) and torch.equal(fixed[0], ref[0])  # given codes are kept
    assert torch.equal(fixed[2], ref[2])


def test_threads_do_not_change_anything():
    w, a, g = _case(16, 300, 512, torch.bfloat16, seed=3)
    runs = []
    for n in (1, 2, 4):
        with _native.kernel_threads(n):
            runs.append(bs.search_blocks(w, a, g=g, offsets=NV, impl="fast"))
    assert all(torch.equal(x, y) for r in runs[1:] for x, y in zip(runs[0], r))


def _oracle(w: torch.Tensor, hb: torch.Tensor, g: torch.Tensor | None, rule: str | None):
    """float64 per-block errors of every candidate [C, N, B] and each candidate's stored code. The
    scale and x / s are float32, as the formats define them (compressed-tensors' fp32 arithmetic:
    a rounding decided in float64 differs where x / s lies within an fp32 ulp of a midpoint)."""
    blk = hb.shape[-1]
    x = w.double().reshape(w.shape[0], -1, blk)
    amax = x.abs().amax(-1)
    errs, codes = [], []
    for off in (NV if g is not None else MX):
        if g is not None:  # NVFP4: the E4M3 code of amax / 6 * g, stepped, as compressed-tensors scales
            c = ((amax.float() / 6 * g).clamp(max=448).to(torch.float8_e4m3fn).view(torch.uint8).int() + off).clamp(1, 126)
            s = c.to(torch.uint8).view(torch.float8_e4m3fn).float() / g
        else:  # MXFP4: the shared exponent (mx.py, checked there against the OCP spec), stepped
            c = (mx_shared_exponent(amax.float(), "fp4", rule) + off).clamp(-127, 127)
            s = torch.pow(2.0, c.double()).float()
        v = (w.float().reshape(x.shape) / s[..., None]).double()
        # nearest E2M1 value, ties to the even code, saturating: brute force over the 8 magnitudes
        grid = torch.tensor([0, 0.5, 1, 1.5, 2, 3, 4, 6], dtype=torch.float64)
        dist = (v.abs()[..., None] - grid).abs()
        near = dist.min(-1, keepdim=True).values
        idx = torch.where(dist == near, torch.arange(8) + 8 * (torch.arange(8) % 2), 99).min(-1).values % 8
        q = grid[idx] * torch.sign(v) * s[..., None].double()
        d = q - x
        errs.append(torch.einsum("rbi,bij,rbj->rb", d, hb.double(), d))
        codes.append(c)
    return torch.stack(errs), torch.stack(codes)


@pytest.mark.parametrize("blk, rule", [(16, None), (32, "floor"), (32, "ceil")])
def test_reference_picks_each_blocks_least_error(blk, rule):
    """Against the float64 oracle: the chosen candidate's error is the least (to fp32 rounding of the
    sum), the row errors are the chosen blocks' errors, and the codes decode to the rounding scored."""
    w, _, g = _case(blk, 40, 256, torch.bfloat16, seed=11)
    hb = _hessian_blocks(256, blk, seed=11)
    packed, scales, row_err = bs.search_blocks(w, bs.tri(hb), g=g, rule=rule, offsets=NV if blk == 16 else MX,
                                               impl="reference")
    errs, codes = _oracle(w, hb, g, rule)
    stored = scales.int() - (0 if blk == 16 else 127)
    chosen = (codes == stored[None]).int().argmax(0)  # first candidate with the stored code
    assert bool((codes == stored[None]).any(0).all())
    got = errs.gather(0, chosen[None])[0]
    tol = 2e-4 * errs.abs().amax(0) + 1e-30
    assert bool((got <= errs.min(0).values + tol).all())
    assert torch.allclose(row_err, got.sum(1), rtol=2e-4)  # fp32 sums with cancellation: ~3e-5 seen
    assert bool((errs[0].sum() - got.sum()) > 0)  # the search moved off RTN's codes somewhere
    # decode: E2M1 values times the chosen scale are what was scored
    s = (scales.view(torch.float8_e4m3fn).float() / g if blk == 16 else torch.pow(2.0, stored.double())).double()
    vals = decode_e2m1(unpack_fp4(packed)).double().reshape(40, -1, blk) * s[..., None]
    x = w.double().reshape(40, -1, blk)
    d = vals - x
    assert torch.allclose(torch.einsum("rbi,bij,rbj->rb", d, hb.double(), d), got, rtol=1e-4, atol=1e-12)


@pytest.mark.parametrize("impl", ["reference", "fast"])
def test_nonfinite_weights_are_refused(impl):
    w, a, g = _case(16, 20, 64, torch.float32, seed=1)
    w[17, 9] = float("nan")
    with pytest.raises(FormatError, match="layers.0.w"):
        bs.search_blocks(w, a, g=g, offsets=NV, name="layers.0.w", impl=impl)


def test_shapes_are_checked():
    w, a, g = _case(16, 20, 64, torch.float32, seed=1)
    with pytest.raises(ValueError, match="do not match blocks of 16"):
        bs.search_blocks(w[:, :48], a, g=g)
