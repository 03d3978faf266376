"""Building and choosing the fused kernels' vector path (kernels/formats/_native.py)."""

import pytest
import torch

from tfcompile.errors import UserError
from tfcompile.kernels.formats import _native, quantize_nvfp4
from tfcompile.settings import settings

X86_INFO = "processor\t: 0\nmodel name\t: AMD EPYC\nflags\t\t: fpu sse2 avx avx2 fma f16c bmi1 bmi2 abm movbe\n"
ARM_INFO = ("processor\t: 0\nBogoMIPS\t: 2000.00\nFeatures\t: fp asimd evtstrm aes sve sve2 bf16\n"
            "CPU implementer\t: 0x41\nCPU architecture: 8\nCPU part\t: 0xd4f\n")


def test_cpu_features_and_tag_read_x86_and_arm_cpuinfo():
    assert {"avx2", "f16c"} <= _native.cpu_features(X86_INFO) and "avx512f" not in _native.cpu_features(X86_INFO)
    assert {"asimd", "sve2", "bf16"} <= _native.cpu_features(ARM_INFO)
    tag = _native.cpu_tag(ARM_INFO)
    assert "Features" in tag and "CPU part\t: 0xd4f" in tag and "BogoMIPS" not in tag
    other = _native.cpu_tag(ARM_INFO.replace("0xd4f", "0xd0c"))  # Neoverse V2 vs N1: same flags, other part
    assert other != tag


def test_build_key_changes_with_path_cpu_and_compiler():
    k = _native.build_key("native", "cc", "flags: avx2")
    assert k == _native.build_key("native", "cc", "flags: avx2")
    assert len({k, _native.build_key("scalar", "cc", "flags: avx2"), _native.build_key("native", "gcc-13", "flags: avx2"),
                _native.build_key("native", "cc", "flags: avx2 avx512f")}) == 4


def test_cached_library_file_is_keyed_by_this_cpu(monkeypatch, tmp_path):
    """_load looks for the file of this CPU's tag: another CPU's build is never picked up."""
    monkeypatch.setenv("TFCOMPILE_CACHE", str(tmp_path))
    seen = []

    def fake_build(out, cc, flags):
        seen.append(out.name)
        raise RuntimeError("stop")

    monkeypatch.setattr(_native, "_build", fake_build)
    for tag in ("cpu A", "cpu B"):
        monkeypatch.setattr(_native, "cpu_tag", lambda tag=tag: tag)
        with pytest.raises(RuntimeError):
            _native._load("scalar")
    assert len(set(seen)) == 2 and all(n.startswith("formats_scalar_") for n in seen)


def test_unknown_or_unrunnable_path_is_a_user_error(monkeypatch):
    with pytest.raises(UserError) as e:
        _native.check_runnable("sse9")
    assert "TFCOMPILE_NATIVE_ISA='sse9'" in e.value.message and "native" in e.value.hint
    monkeypatch.setattr(_native, "_cpuinfo", lambda: X86_INFO.replace(" avx2", ""))
    monkeypatch.setattr(_native, "_machine", lambda: "x86_64")
    with pytest.raises(UserError, match="lacks avx2"):
        _native.check_runnable("avx2")
    assert "avx2" not in _native.runnable() and "scalar" in _native.runnable()


def test_the_setting_picks_the_path(monkeypatch):
    assert settings({"TFCOMPILE_NATIVE_ISA": " AVX2 "}).native_isa == "avx2"
    assert settings({}).native_isa == "native"
    monkeypatch.setitem(_native._state, "isa", None)  # as at first use
    monkeypatch.setenv("TFCOMPILE_NATIVE_ISA", "scalar")
    assert _native.compiled_isa(_native.lib()) == "scalar"
    monkeypatch.setitem(_native._state, "isa", None)
    monkeypatch.setenv("TFCOMPILE_NATIVE_ISA", "no-such-path")
    with pytest.raises(UserError, match="TFCOMPILE_NATIVE_ISA"):
        quantize_nvfp4(torch.randn(4, 64))


def test_native_is_the_widest_path_this_cpu_has():
    paths = _native.runnable()
    want = {"x86_64": next((p for p in ("avx512", "avx2") if p in paths), "scalar"), "aarch64": "neon"}
    with _native.use("native") as handle:
        assert _native.compiled_isa(handle) == want.get(_native._machine(), "scalar")
