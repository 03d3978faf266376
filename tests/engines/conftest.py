"""Session fixtures for tests/engines: the tiny artifacts every engine check reads, and one vLLM run
(one process, vllm_driver.py) over all of them."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "families"))

from engine_util import run_driver, vllm_python  # noqa: E402
from families_util import load_fixture, quantize  # noqa: E402

MIXED = ("--set", "mixed.avg_bits=6.0", "--set", "mixed.samples=1", "--set", "mixed.seq_len=32",
         "--set", "mixed.data=random")
FORMATS = ("nvfp4", "nvfp4a16", "mxfp4", "mxfp4a16", "mxfp8", "fp8", "fp8-dynamic", "fp8-block")
# case -> (source, format, extra quantize options). "llama": hidden 256, 4 heads of 64, 2 KV heads
# (every output partition a multiple of 128, so fp8-block divides); the families at their tiny size.
CASES = {f"llama-{f}": ("llama", f, ()) for f in FORMATS}
CASES.update({
    "llama-fp8-dynamic-kv-fp8": ("llama", "fp8-dynamic", ("--kv-cache", "fp8")),
    "llama-mixed": ("llama", "nvfp4a16", MIXED),
    "deepseek_v3-fp8-dynamic": ("deepseek_v3", "fp8-dynamic", ()),  # MLA, shared + routed experts
    "deepseek_v3-nvfp4": ("deepseek_v3", "nvfp4", ()),
    "qwen3_moe-nvfp4a16": ("qwen3_moe", "nvfp4a16", ()),
    "glm4_moe-fp8-dynamic": ("glm4_moe", "fp8-dynamic", ()),
    "qwen3-fp8-dynamic": ("qwen3", "fp8-dynamic", ()),
    "qwen3_next-fp8-dynamic": ("qwen3_next", "fp8-dynamic", ()),  # Gated DeltaNet kept, MoE
    "gpt_oss-mxfp4a16": ("gpt_oss", "mxfp4a16", ()),  # sinks, biased experts
})
# the 2026 families (DSA indexer, Gated DeltaNet + vision, experts w1/w2/w3), fp8-dynamic and nvfp4
# and Kimi K2.5 (vision wrapper around the K2 language model: kimi_k25.py builds the tower unquantized)
for _fam in ("deepseek_v32", "glm_moe_dsa", "qwen3_5", "qwen3_5_moe", "minimax_m2", "kimi_k25"):
    CASES.update({f"{_fam}-{f}": (_fam, f, ()) for f in ("fp8-dynamic", "nvfp4")})
# MTP layers (source "+mtp": the published layout, tests/fixtures/families.py add_mtp_layer /
# add_qwen3_5_mtp): the driver loads vLLM's MTP draft model too (speculative_config method "mtp")
MTP_CASES = {
    "deepseek_v3+mtp-nvfp4": ("deepseek_v3+mtp", "nvfp4", ()),  # layer 4: DeepSeekMTP
    "deepseek_v32+mtp-nvfp4": ("deepseek_v32+mtp", "nvfp4", ()),  # DSA indexer in the MTP block
    "glm4_moe+mtp-fp8-dynamic": ("glm4_moe+mtp", "fp8-dynamic", ()),  # Glm4MoeMTP
    "qwen3_5+mtp-fp8-dynamic": ("qwen3_5+mtp", "fp8-dynamic", ()),  # mtp.*: Qwen3_5MTP
    "qwen3_5_moe+mtp-nvfp4": ("qwen3_5_moe+mtp", "nvfp4", ()),  # mtp.* beside the vision wrapper
}
CASES.update(MTP_CASES)
# artifacts vLLM refuses, with its message: tfcompile's engine checks must refuse them too
REFUSED = {
    "llama128-fp8-block": ("llama128", "fp8-block", (), "is not divisible by weight quantization block_n = 128"),
    "llama-nvfp4-kv-nvfp4": ("llama", "nvfp4", ("--kv-cache", "nvfp4"),
                             "Currently supported kv cache quantization is num_bits=8"),
}


@pytest.fixture(scope="session")
def vllm_py() -> str:
    return vllm_python()


@pytest.fixture(scope="session")
def engine_src(tmp_path_factory):
    """engine_src(name) -> a tiny checkpoint: "llama", "llama128" (KV rows 64) or a family of
    tests/fixtures/families.py ("FAMILY+mtp": with its MTP layer)."""
    root, cache = tmp_path_factory.mktemp("engine-src"), {}
    models, families = load_fixture("models"), load_fixture("families")

    def get(name: str) -> Path:
        if name not in cache:
            out = root / name
            if name == "llama":
                cache[name] = models.make_tiny_llama(out, hidden=256, intermediate=512, heads=4, kv_heads=2)
            elif name == "llama128":
                cache[name] = models.make_tiny_llama(out)
            elif name.endswith("+mtp"):  # the family's checkpoint with its MTP layer, as published
                base = name.removesuffix("+mtp")
                add = families.add_qwen3_5_mtp if base.startswith("qwen3_5") else families.add_mtp_layer
                cache[name] = add(_build(families, base, out))
            else:
                cache[name] = _build(families, name, out)
        return cache[name]

    return get


def _build(families, name: str, out: Path) -> Path:
    if name in ("deepseek_v3", "kimi_k2", "deepseek_v32", "glm_moe_dsa"):  # the published config.json's
        # routing fields (vLLM's DeepseekV2MoE has `gate.e_score_correction_bias` only for noaux_tc)
        return families.FAMILIES[name].build(out, topk_method="noaux_tc", scoring_func="sigmoid")
    return families.FAMILIES[name].build(out)


@pytest.fixture(scope="session")
def engine_artifact(engine_src, tmp_path_factory):
    root, cache = tmp_path_factory.mktemp("engine-artifacts"), {}

    def get(case: str) -> Path:
        if case not in cache:
            src, fmt, extra = (CASES.get(case) or REFUSED[case])[:3]
            cache[case] = quantize(engine_src(src), root / case, fmt, *extra)
        return cache[case]

    return get


@pytest.fixture(scope="session")
def vllm_reports(vllm_py, engine_artifact):
    """case -> vllm_driver.py's inspect report; all cases in one vLLM process (~3-4 min here)."""
    cases = list(CASES) + list(REFUSED)
    paths = [engine_artifact(c) for c in cases]
    reports = run_driver(vllm_py, "inspect", *paths)
    return dict(zip(cases, reports))
