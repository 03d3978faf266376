"""The CPU key of the byte gate (bench/artifact_hashes.py) and of a manifest's `machine` record names
everything the float bits follow: equal keys must mean equal bits. Two Xeons alike in vendor, ISA
and bf16 but one with AMX tiles gave other bytes for GPTQ and AWQ artifacts (2026-12-06), and with
ONEDNN_MAX_CPU_ISA capped below AMX the AMX machine gave the other one's bytes: so AMX, and
oneDNN's cap on it, are part of the key, as is the core's model."""

from __future__ import annotations

import pytest

from tfcompile import machine

XEON = """processor\t: 0
vendor_id\t: GenuineIntel
cpu family\t: 6
model\t\t: 167
model name\t: Intel(R) Xeon(R) Processor
flags\t\t: fpu sse2 avx2 avx512f avx512_bf16 amx_bf16 amx_tile amx_int8
processor\t: 1
model\t\t: 99
"""
GRACE = """processor\t: 0
BogoMIPS\t: 2000.00
Features\t: fp asimd bf16 sve2
CPU implementer\t: 0x41
CPU architecture: 8
CPU part\t: 0xd4f
"""


@pytest.fixture
def cpuinfo(monkeypatch, tmp_path):
    """machine._cpuinfo reading `text` as /proc/cpuinfo (its cache cleared before and after)."""
    real = machine.Path

    def use(text: str):
        f = tmp_path / "cpuinfo"
        f.write_text(text)
        monkeypatch.setattr(machine, "Path", lambda p: f if p == "/proc/cpuinfo" else real(p))
        machine._cpuinfo.cache_clear()

    monkeypatch.delenv("ONEDNN_MAX_CPU_ISA", raising=False)
    monkeypatch.delenv("DNNL_MAX_CPU_ISA", raising=False)
    yield use
    machine._cpuinfo.cache_clear()


def test_model_and_amx_read_from_cpuinfo_of_x86_and_arm(cpuinfo):
    cpuinfo(XEON)
    assert machine._cpuinfo()[0] == "GenuineIntel"
    assert machine._cpuinfo()[2] == "6.167"  # the first processor's, not a later one's
    assert machine.amx() and machine.native_bf16()
    cpuinfo(GRACE)
    assert machine._cpuinfo()[::2] == ("0x41", "0xd4f")
    assert not machine.amx() and machine.native_bf16()


@pytest.mark.parametrize("cap, amx", [("", True), ("AVX512_CORE_AMX", True), ("ALL", True),
                                      ("AVX512_CORE_BF16", False), ("avx2", False)])
def test_onednn_cap_below_amx_turns_it_off(cpuinfo, monkeypatch, cap, amx):
    cpuinfo(XEON)
    if cap:
        monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", cap)
    assert machine.amx() is amx


def test_key_names_model_and_amx_and_keeps_old_profiles_keys():
    base = {"arch": "x86_64", "vendor": "GenuineIntel", "isa": "AVX512", "native_bf16": True, "blas": "mkl"}
    # a manifest's `machine` record written before `model` and `amx` existed keys as it did then
    assert machine.cpu_key(base) == "x86_64 GenuineIntel AVX512 bf16 mkl"
    amx = machine.cpu_key({**base, "model": "6.167", "amx": True})
    no_amx = machine.cpu_key({**base, "model": "6.167", "amx": False})
    other = machine.cpu_key({**base, "model": "6.143", "amx": True})
    assert amx == "x86_64 GenuineIntel 6.167 AVX512 bf16 amx mkl"
    assert len({amx, no_amx, other, machine.cpu_key(base)}) == 4


def test_profile_of_this_machine_has_every_field():
    p = machine.cpu_profile()
    assert set(p) == {"arch", "vendor", "model", "isa", "native_bf16", "amx", "blas"}
    assert machine.cpu_key(p) == machine.cpu_key()
