"""The emit_cutlass pass: scheduling, sources without nvcc, and (with nvcc) the demo LM's kernels
compiled for sm_90a and sm_100a with their MMAs checked in the SASS, cached across emits."""

from __future__ import annotations

import hashlib
import json
import subprocess

import pytest
from cutlass_support import DEMO, TARGETS, demo_args, needs_nvcc, pass_stats, quantize, triton_bin, variant_format


def _names(res):
    return list(res.json()["passes"]) if isinstance(res.json()["passes"], dict) else \
        [p["name"] for p in res.json()["passes"]]


def test_plan_schedules_emit_cutlass_after_manifest(run_cli, monkeypatch):
    res = run_cli("plan", "--format", "fp8", "--target", "sm_90a,sm_100a", "--set", "emit_cutlass.compile=auto")
    assert res.code == 0, res.err
    names = _names(res)
    assert names[-4:] == ["emit", "manifest", "emit_cutlass", "verify"]
    cfg = next(p for p in res.json()["passes"] if p["name"] == "emit_cutlass")["config"]
    assert cfg["targets"] == ["sm_90a", "sm_100a"] and cfg["compile"] == "auto"  # --target inherited
    assert "emit_cutlass" not in _names(run_cli("plan", "--format", "fp8", "--target", "sm_90a"))
    flag = run_cli("plan", "--format", "nvfp4", "--target", "sm_100a", "--cutlass", "never")  # the CLI flag
    assert flag.code == 0, flag.err
    cfg = next(p for p in flag.json()["passes"] if p["name"] == "emit_cutlass")["config"]
    assert cfg["targets"] == ["sm_100a"] and cfg["compile"] == "never"
    assert run_cli("plan", "--format", "fp8", "--cutlass", "sometimes").code == 2  # click: usage error
    alone = run_cli("plan", "--format", "mxfp4", *TARGETS)  # its own targets, no Triton emission
    assert "emit_cutlass" in _names(alone) and "emit" not in _names(alone)
    bad = run_cli("plan", "--format", "fp8", *TARGETS, "--set", "emit_cutlass.compile=maybe")
    assert bad.code == 1 and "auto, always, never" in bad.err
    monkeypatch.setenv("TFCOMPILE_NVCC", "/nonexistent/nvcc")
    from tfcompile.kernels.cutlass.toolchain import _detect

    _detect.cache_clear()
    bad = run_cli("plan", "--format", "fp8", *TARGETS, "--set", "emit_cutlass.compile=always")
    assert bad.code == 1 and "nvcc not found" in bad.err and "hint:" in bad.err
    _detect.cache_clear()


def test_sources_are_emitted_without_nvcc(tmp_path, run_cli, monkeypatch, cutlass_cache):
    from tfcompile.kernels.cutlass.toolchain import _detect

    monkeypatch.setenv("TFCOMPILE_NVCC", "/nonexistent/nvcc")
    _detect.cache_clear()
    out = tmp_path / "out"
    doc = quantize(DEMO, out, "mxfp4", *TARGETS)
    _detect.cache_clear()
    assert any("not compiled" in w and "nvcc not found" in w for w in doc["warnings"])
    manifest = json.loads((out / "tfcompile/manifest.json").read_text())
    sec = manifest["cutlass"]
    assert sec["compiled"] is False and "nvcc not found" in sec["why_not"] and sec["nvcc"] is None
    assert sec["targets"]["sm_90a"]["sources"] == [] and "no FP4 tensor cores" in sec["targets"]["sm_90a"]["note"]
    stems = sec["targets"]["sm_100a"]["sources"]
    assert stems and all("cutlass_mxfp4_gemm_sm100_" in s for s in stems)
    for stem in stems:
        src = (out / f"{stem}.cu").read_text()
        assert "do not edit" in src.splitlines()[0] and "mx_float4_t" in src
        rec = json.loads((out / f"{stem}.json").read_text())
        assert rec["compiled"] is False and rec["library"] is None and not (out / f"{stem}.so").exists()
        assert rec["source_sha256"] == hashlib.sha256(src.encode()).hexdigest()
        assert rec["entry"]["run"].endswith("_run") and rec["problems"]
    for rel, digest in manifest["files"].items():  # every file written is checksummed
        assert hashlib.sha256((out / rel).read_bytes()).hexdigest() == digest, rel
    assert any(k.startswith("kernels/sm_100a/cutlass/") for k in manifest["files"])
    table = json.loads((out / "kernels/tuning.json").read_text())
    assert any(k.endswith(":cutlass-" + sec["version"]) for k in table["entries"])
    index = json.loads((out / "kernels/sm_100a/cutlass/index.json").read_text())
    assert {(r["n"], r["k"]) for r in index["problems"]} == {(256, 256), (128, 256), (768, 256), (256, 768)}
    assert run_cli("verify", out).code == 0
    assert pass_stats(doc, "emit_cutlass")["compiled"] == 0


def _sass(path) -> str:
    res = subprocess.run([triton_bin("cuobjdump"), "-sass", str(path)], capture_output=True, text=True, check=True)
    return res.stdout


def _nvdisasm(path, tmp_path) -> str:
    """The same SASS via nvdisasm: extract the sm_* ELF with cuobjdump, disassemble it."""
    work = tmp_path / "elf"
    work.mkdir(exist_ok=True)
    subprocess.run([triton_bin("cuobjdump"), "-xelf", "all", str(path)], cwd=work, check=True, capture_output=True)
    text = ""
    for elf in sorted(work.glob("*.cubin")):
        text += subprocess.run([triton_bin("nvdisasm"), "-c", str(elf)], capture_output=True, text=True,
                               check=True).stdout
    return text


# what each format's SASS must show (docs/kernels.md "CUTLASS": SASS evidence): wgmma e4m3 on
# sm_90a; tcgen05 block-scaled FP4 MMA on sm_100a (.4X: 4 scale factors per 64 K, i.e. block 16)
EXPECT = {"fp8": ("QGMMA.", ".F32.E4M3.E4M3"), "nvfp4": ("UTCOMMA.4X", "tmem"), "mxfp4": ("UTCOMMA ", "tmem")}


@needs_nvcc
@pytest.mark.parametrize("variant", ["fp8-one", "nvfp4", pytest.param("fp8", marks=pytest.mark.slow),
                                     pytest.param("mxfp4", marks=pytest.mark.slow)])
def test_demo_lm_kernels_compile_with_their_mma(variant, demo_artifact, run_cli, tmp_path):
    """One real nvcc build per target in the default job (fp8-one: sm_90a; nvfp4: sm_100a); the
    slow job adds the second sm_90a schedule and MXFP4."""
    out, doc = demo_artifact(variant)
    fmt = variant_format(variant)
    manifest = json.loads((out / "tfcompile/manifest.json").read_text())
    sec = manifest["cutlass"]
    assert sec["compiled"] is True and "release" in sec["nvcc"]
    target = "sm_90a" if fmt == "fp8" else "sm_100a"
    stems = sec["targets"][target]["sources"]
    assert stems and all(sec["targets"][t]["sources"] == [] for t in sec["targets"] if t != target)
    if variant == "fp8":  # both sm_90a schedules: ping-pong (small M) and cooperative (large M)
        assert any("_pingpong_" in st for st in stems) and any("_coop_" in st for st in stems), stems
    if variant == "fp8-one":
        assert len(stems) == 1, stems
    for stem in stems:
        so = out / f"{stem}.so"
        text = _sass(so)
        assert f"arch = {target}" in text
        head, tail = EXPECT[fmt]
        mma = [ln for ln in text.splitlines() if "*/" in ln and head in ln and tail in ln.split(";")[0]]
        assert mma, f"{stem}: no {head}...{tail} instruction in the SASS"
        if fmt == "mxfp4":
            assert "UTCOMMA.4X" not in text  # block 32: the default (2X) scale-factor rate
        assert any(head in ln and tail in ln for ln in _nvdisasm(so, tmp_path).splitlines())
        rec = json.loads((out / f"{stem}.json").read_text())
        assert rec["compiled"] and rec["sass"]["archs"] == [target] and rec["sass"]["mma"]
        assert rec["nvcc"]["flags"][rec["nvcc"]["flags"].index("-gencode") + 1].endswith(f"code={target}")
        assert manifest["files"][f"{stem}.so"] == hashlib.sha256(so.read_bytes()).hexdigest()
    assert run_cli("verify", out).code == 0


@needs_nvcc
def test_the_libraries_c_abi_without_a_gpu(demo_artifact):
    """What the runtime binds (runtime/cutlass.py) works on a CPU machine up to the launch:
    symbols, the embedded config, can_implement's alignment rules, "no device" (5)."""
    import ctypes

    import torch

    from tfcompile.errors import UserError
    from tfcompile.runtime import load_artifact
    from tfcompile.runtime.cutlass import CutlassLaunchError, CutlassStore

    for variant, target, kernel, align, buckets in (
            ("fp8-one", "sm_90a", "cutlass_fp8_gemm_sm90", 16, [1]),
            ("nvfp4", "sm_100a", "cutlass_nvfp4_gemm_sm100", 32, [1, 16, 64, 256, 1024, 4096])):
        fmt = variant_format(variant)
        out, _ = demo_artifact(variant)
        store = CutlassStore(out, target)
        assert store.index["compiled"] and store.index["kernels"] == [kernel]
        stems = store.stems(kernel, 768, 256)
        assert sorted(stems) == buckets
        for stem in sorted(set(stems.values())):
            lib = store.get(stem)
            assert lib.config() == lib.doc["config"]
            assert all(lib.can_implement(m, n, k, 3 if fmt == "fp8" else 0)
                       for m in (1, 77, 4096) for n, k in ((768, 256), (256, 768), (128, 256)))
            assert not lib.can_implement(16, 256, 256 + align // 2, 0)  # K off the TMA alignment
            null = ctypes.c_void_p(0)
            assert lib._run(*[null] * 6, 16, 256, 256, 0, null, 0, null) == 5  # no CUDA device here
            with pytest.raises(CutlassLaunchError, match="CUDA tensors"):
                lib.gemm(None, None, None, None, None, torch.empty(1, 1), 1, 256, 256)
        art = load_artifact(out, "cpu", kernels="cutlass")
        assert art.kernels == "emulated"
        with pytest.raises(UserError, match="unknown kernels"):
            load_artifact(out, "cpu", kernels="cudnn")


@needs_nvcc
def test_a_second_emit_compiles_nothing(demo_artifact, tmp_path, cutlass_cache):
    first, doc1 = demo_artifact("nvfp4")
    again = quantize(DEMO, tmp_path / "again", "nvfp4", *demo_args("nvfp4"))
    s = pass_stats(again, "emit_cutlass")
    assert s["compiled"] == 0 and s["cached"] == s["sources"] == pass_stats(doc1, "emit_cutlass")["sources"]
    for so in (first / "kernels/sm_100a/cutlass").glob("*.so"):
        assert (tmp_path / "again/kernels/sm_100a/cutlass" / so.name).read_bytes() == so.read_bytes()
    assert len(list(cutlass_cache.glob("*.so"))) >= s["sources"]


@needs_nvcc
@pytest.mark.slow
def test_sm_100_without_a_drops_the_kernel_body_and_the_check_catches_it(cutlass_cache):
    """The trap of docs/kernels.md "Hardware facts" (nvcc), reproduced: `-arch=sm_100` compiles, but the MMA is gone.
    (Built once per cache, like the kernels: keyed by source, flags and nvcc.)"""
    from tfcompile.kernels.cutlass import configs, render, sass
    from tfcompile.kernels.cutlass.toolchain import detect, nvcc_flags

    tc = detect()
    source = render.render(configs.NVFP4_SM100, configs.NVFP4_SM100.default_config)
    flags = [f for f in nvcc_flags("100a") if f != "-gencode" and not f.startswith("arch=")] + ["-arch=sm_100"]
    key = hashlib.sha256(json.dumps([source, flags, tc.version]).encode()).hexdigest()
    so = cutlass_cache / f"trap-sm_100-{key[:24]}.so"
    if not so.is_file():
        cutlass_cache.mkdir(parents=True, exist_ok=True)
        src = cutlass_cache / f"trap-{key[:24]}.cu"
        src.write_text(source)
        tmp = so.with_suffix(".tmp")
        subprocess.run([tc.nvcc, *flags, *(f"-I{d}" for d in tc.includes), "-o", str(tmp), str(src)],
                       check=True, capture_output=True, timeout=1800)
        tmp.replace(so)
    text = _sass(so)
    assert sass.archs(text) == ["sm_100"]
    assert not any(op.startswith(("UTCOMMA", "UTCQMMA")) for op in sass.mma_counts(text))  # silently dropped
    with pytest.raises(sass.MissingMmaError) as e:
        sass.check(text, configs.NVFP4_SM100.mma, "100a", "nvfp4 built with -arch=sm_100")
    assert "not sm_100a" in str(e.value) and "compiled out" in str(e.value)
    assert "compute_100a,code=sm_100a" in e.value.hint
