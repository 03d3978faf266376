"""The fused C kernels (impl="fast") equal the plain-torch reference bit for bit."""

import os

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tfcompile.errors import FormatError
from tfcompile.kernels.formats import _native, fast, quantize_fp8, quantize_mxfp4, quantize_mxfp8, quantize_nvfp4

from fmt_oracles import DTYPES

pytestmark = pytest.mark.skipif(not fast.available(torch.zeros(1)), reason="no C compiler: fast path off")


def _paths() -> list[str]:
    """`native` plus each forced vector path this CPU runs that compiles to another one.

    Here (AVX-512): native (= avx512), avx2 (x86-64-v3) and scalar; on an AVX2-only CPU: native
    (= avx2) and scalar. The aarch64 build is tested under qemu (test_aarch64.py)."""
    seen, out = set(), []
    for isa in _native.runnable():
        with _native.use(isa) as handle:
            got = _native.compiled_isa(handle) if handle is not None else None
        if got is not None and got not in seen:
            seen.add(got)
            out.append(isa)
    return out


@pytest.fixture(scope="module", autouse=True, params=_paths() if fast.available(torch.zeros(1)) else ["native"])
def isa_path(request):
    """Every test of this module runs once per vector path (module scope: hypothesis-safe)."""
    with _native.use(request.param) as handle:
        yield _native.compiled_isa(handle)

QUANTIZERS = [
    ("nvfp4", lambda w, impl: quantize_nvfp4(w, impl=impl), 16),
    ("mxfp4-floor", lambda w, impl: quantize_mxfp4(w, rule="floor", impl=impl), 32),
    ("mxfp4-ceil", lambda w, impl: quantize_mxfp4(w, rule="ceil", impl=impl), 32),
    ("mxfp8-floor", lambda w, impl: quantize_mxfp8(w, rule="floor", impl=impl), 32),
    ("mxfp8-ceil", lambda w, impl: quantize_mxfp8(w, rule="ceil", impl=impl), 32),
    ("fp8-tensor", lambda w, impl: quantize_fp8(w, "tensor", impl=impl), 1),
    ("fp8-channel", lambda w, impl: quantize_fp8(w, "channel", impl=impl), 1),
    ("fp8-block", lambda w, impl: quantize_fp8(w, "block", impl=impl), 1),
]


def assert_same(a, b):
    for f in ("data", "scale", "global_scale"):
        x, y = getattr(a, f), getattr(b, f)
        if x is None:
            assert y is None
            continue
        assert x.dtype == y.dtype and x.shape == y.shape, f
        assert torch.equal(x.view(torch.uint8) if x.element_size() == 1 else x,
                           y.view(torch.uint8) if y.element_size() == 1 else y), f
    assert (a.shape, a.granularity, a.rule, a.block) == (b.shape, b.granularity, b.rule, b.block)


def make(shape, dtype, seed, spread):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(shape, generator=g) * torch.exp(torch.randn(shape[:-1] + (1,), generator=g) * spread)
    w.view(-1)[:: 97] *= 1e4           # outliers
    w.view(-1)[5:: 89] = 1e-6          # tiny values
    w.view(-1)[:64] = 0                # zero blocks
    if dtype == torch.float16:
        w = w.clamp(-6e4, 6e4)         # stay finite in fp16
    return w.to(dtype)


@pytest.mark.parametrize("name,fn,blk", QUANTIZERS, ids=[q[0] for q in QUANTIZERS])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(64, 512), (3, 40, 96), (17, 4096), (1, 96), (2, 128, 224), (130, 288)])
def test_fast_equals_reference(name, fn, blk, dtype, shape):
    w = make(shape, dtype, seed=len(name) + shape[-1], spread=3.0)
    assert_same(fn(w, "fast"), fn(w, "reference"))


@settings(max_examples=int(os.environ.get("TFC_HYPOTHESIS_EXAMPLES", 25)), deadline=None, database=None)
@given(rows=st.integers(1, 40), kb=st.integers(1, 12), lead=st.sampled_from([(), (2,)]),
       dtype=st.sampled_from(DTYPES), spread=st.floats(0, 12), seed=st.integers(0, 2**16),
       which=st.integers(0, len(QUANTIZERS) - 1))
def test_fast_equals_reference_random(rows, kb, lead, dtype, spread, seed, which):
    name, fn, _ = QUANTIZERS[which]
    w = make(lead + (rows, kb * 32), dtype, seed, spread)
    assert_same(fn(w, "fast"), fn(w, "reference"))


@pytest.mark.parametrize("gran,shape,fused", [("channel", (130, 270), True), ("block", (130, 270), True),
                                               ("block", (2, 128, 200), True), ("block", (3, 40, 96), False),
                                               # a band of 128 rows in chunks of TILE_COLS (4096) columns, a tail
                                               ("block", (130, 2 * 4096 + 200), True),
                                               ("channel", (3, 2 * 4096 + 200), True),
                                               ("tensor", (130, 270), False)])
def test_fp8_one_pass_kernel_is_the_one_taken(monkeypatch, gran, shape, fused):
    """Channel and block scales come from the one-pass tile kernel (the equality tests above then test
    it); per-tensor scales and blocks that would span two experts take amax_grid + fp8_quant."""
    calls = []
    real = fast.fp8_tiles
    monkeypatch.setattr(fast, "fp8_tiles", lambda *a: calls.append(a[1:3]) or real(*a))
    w = make(shape, torch.bfloat16, 3, 2.0)
    assert_same(quantize_fp8(w, gran, impl="fast"), quantize_fp8(w, gran, impl="reference"))
    want = {"channel": [(1, shape[-1])], "block": [(128, 128)]}.get(gran) if fused else []
    assert calls == want


def test_fast_threads_equal_single_thread():
    w = make((300, 1024), torch.bfloat16, 1, 2.0)
    n = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = [fn(w, "fast") for _, fn, _ in QUANTIZERS]
        torch.set_num_threads(2)
        two = [fn(w, "fast") for _, fn, _ in QUANTIZERS]
    finally:
        torch.set_num_threads(n)
    for a, b in zip(one, two):
        assert_same(a, b)


@pytest.mark.parametrize("name,fn,blk", QUANTIZERS, ids=[q[0] for q in QUANTIZERS])
@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_fast_rejects_nonfinite(name, fn, blk, bad):
    w = torch.randn(8, 256).bfloat16()
    w[5, 200] = bad
    with pytest.raises(FormatError):
        fn(w, "fast")


def test_kernel_threads_caps_and_restores_without_changing_bytes():
    from tfcompile.kernels.formats import _native, kernel_threads, quantize_nvfp4

    w = torch.randn(512, 1024).bfloat16()
    want = quantize_nvfp4(w)
    seen = []
    real = _native.parallel

    def spy(total, call, grain=1):
        seen.append(_native._limit["n"])
        return real(total, call, grain)

    _native.parallel = spy
    try:
        with kernel_threads(1):
            got = quantize_nvfp4(w)
    finally:
        _native.parallel = real
    assert seen and set(seen) == {1} and _native._limit["n"] is None
    assert torch.equal(got.data, want.data) and torch.equal(got.scale.view(torch.uint8), want.scale.view(torch.uint8))


def midpoint_row(amax: float) -> tuple[torch.Tensor, float]:
    """A float32 row whose x / s (s = amax / 448, the scale every FP8 granularity computes from it) lies
    within 8 ulps of each E4M3 rounding midpoint (normal and subnormal grid, both signs) and of 2^-6: the
    inputs where x * (1/s), the kernels' divide-free path, can round to another code than x / s.
    Each 128-element chunk starts with amax, so the tensor, channel and 128-block scales are all s."""
    codes = torch.arange(0, 0x7F, dtype=torch.uint8).view(torch.float8_e4m3fn).float()  # 0 .. 448
    pts = torch.cat([(codes[:-1] + codes[1:]) / 2, torch.tensor([2.0 ** -6])])  # midpoints, exact in fp32
    s = (torch.tensor([amax]) / 448).item()
    near = (pts.double() * s).float().view(torch.int32)[:, None] + torch.arange(-8, 9)[None, :]
    x = near.flatten().view(torch.float32)
    x = torch.cat([x, -x])
    x = torch.cat([x, torch.zeros(-x.numel() % 127)]).reshape(-1, 127)
    x = torch.cat([torch.full((x.shape[0], 1), amax), x], 1)  # [chunks, 128]
    return x.reshape(1, -1), s


@pytest.mark.parametrize("gran", ["tensor", "channel", "block"])
def test_fp8_codes_at_rounding_midpoints_equal_torch_division(gran):
    """Oracle: torch's own (x / s).to(float8_e4m3fn). The row is built so that a plain x * (1/s) misses it
    on some inputs (asserted), so a kernel that multiplies without the midpoint fallback fails here."""
    naive_misses = 0
    for amax in (1.0, 3.3, 0.0123, 7.77e-3, 123.456, 5e-20, 2.5e30):
        x, s = midpoint_row(amax)
        q = quantize_fp8(x, gran, impl="fast")
        assert torch.equal(q.scale.flatten().unique(), torch.tensor([s])), (amax, q.scale.flatten()[:4])
        want = (x / s).to(torch.float8_e4m3fn).view(torch.uint8)
        assert torch.equal(q.data.view(torch.uint8), want), amax
        naive = (x * (1 / torch.tensor(s))).to(torch.float8_e4m3fn).view(torch.uint8)
        naive_misses += int((naive != want).sum())
    assert naive_misses > 0
