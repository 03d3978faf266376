"""vLLM 0.32 (CPU build, its own venv) as the oracle of what tfcompile writes: its own
CompressedTensorsConfig parses each artifact, its own model classes build the fused layers, and
for every Linear it picks the scheme the manifest says (ignore list and KV scheme included); its
own weight loaders accept every tensor (name, shape: they assert it; dtype: checked here). Where
the CPU build has no GEMM kernel a stand-in that cannot run takes the kernel's place
(tests/engines/vllm_driver.py): loaders, shapes and scheme choice are vLLM's.

Slow job: one vLLM process inspects every case (~2-3 min on the 2-core CI machine).
"""

from __future__ import annotations

import pytest

from conftest import CASES, MTP_CASES, REFUSED
from engine_util import kv_problems, loader_problems, scheme_problems
from families_util import manifest

from tfcompile.machine import cpu_flags

pytestmark = pytest.mark.slow

# vLLM's own defects, each pinned until it is fixed upstream (the test then XPASSes and fails)
DEFECTS = {
    "llama-mxfp4a16": ("scheme", "vLLM 0.32 serves compressed-tensors MXFP4 weight-only as W4A4: "
                       "CompressedTensorsW4A4Mxfp4() always asks for kMxfp4Dynamic activations "
                       "(https://github.com/vllm-project/vllm/issues/56770)"),
    "gpt_oss-mxfp4a16": ("load", "vLLM 0.32's GPT-OSS loader takes only per-expert fused experts "
                         "(`experts.{e}.gate_up_proj` -> w13): llm-compressor's per-expert gate_proj / "
                         "up_proj / down_proj (+ .bias) layout raises KeyError "
                         "'layers.0.mlp.experts.0.w2_bias' (https://github.com/vllm-project/vllm/issues/40358)"),
}

# the CPU has AMX tiles (Intel Sapphire Rapids and later): vLLM's CPU build then takes AMX kernels
AMX = "amx_bf16" in cpu_flags()


def _defect(case: str, what: str):
    d = DEFECTS.get(case)
    if d and (d[0] == what or d[0] == "load"):  # what does not load has no scheme to check either
        return pytest.mark.xfail(strict=True, reason=d[1])
    return None


def _params(what: str):
    out = []
    for case in CASES:
        mark = _defect(case, what)
        out.append(pytest.param(case, marks=mark) if mark else case)
    return out


@pytest.mark.parametrize("case", _params("load"))
def test_vllm_builds_and_loads_every_tensor(case, vllm_reports):
    rep = vllm_reports[case]
    assert "error" not in rep, f"{case}: vLLM refused the artifact: {rep.get('error')}\n{rep.get('traceback', '')}"
    assert rep["quant_config"] == "CompressedTensorsConfig"
    bad = loader_problems(rep)
    assert not bad, f"{case}: {len(bad)} tensors vLLM's loaders do not take as written:\n" + "\n".join(bad[:20])


@pytest.mark.parametrize("case", _params("scheme"))
def test_vllm_chooses_the_manifest_scheme_for_every_linear(case, vllm_reports, engine_artifact):
    rep = vllm_reports[case]
    if "error" in rep:
        pytest.fail(f"{case}: vLLM refused the artifact: {rep['error']}")
    bad = scheme_problems(rep, manifest(engine_artifact(case)))
    assert not bad, f"{case}: {len(bad)} Linears served otherwise than written:\n" + "\n".join(bad[:20])


@pytest.mark.parametrize("case", [c for c in CASES if "kv" in c or c == "llama-fp8-dynamic"])
def test_vllm_serves_the_kv_scales_written(case, vllm_reports, engine_artifact):
    rep = vllm_reports[case]
    assert "error" not in rep, rep.get("error")
    bad = kv_problems(rep, manifest(engine_artifact(case)), engine_artifact(case))
    assert not bad, "\n".join(bad)
    if manifest(engine_artifact(case))["scheme"].get("kv_cache"):
        assert rep["kv_cache_scheme"]["num_bits"] == 8 and rep["kv_cache_scheme"]["type"] == "float"


@pytest.mark.parametrize("case", list(REFUSED))
def test_vllm_refuses_what_it_cannot_serve_and_so_does_verify_engine(case, vllm_reports, engine_artifact):
    """The engine's refusals, with its message; tfcompile's engine rules refuse the same artifact."""
    from tfcompile.artifact.engines import engine_problems

    assert REFUSED[case][3] in vllm_reports[case].get("error", ""), vllm_reports[case].get("error")
    errors = [p for p in engine_problems(manifest(engine_artifact(case)), "vllm") if p.error]
    assert errors, f"{case}: vLLM refuses it ({vllm_reports[case]['error'][:200]}), tfcompile's rules do not"


@pytest.mark.parametrize("case", [c for c in CASES if c not in DEFECTS])
def test_verify_engine_refuses_nothing_vllm_loads(case, vllm_reports, engine_artifact):
    from tfcompile.artifact.engines import engine_problems

    assert vllm_reports[case].get("loaded"), vllm_reports[case].get("error")
    assert not [p.message for p in engine_problems(manifest(engine_artifact(case)), "vllm") if p.error]


def test_moe_families_load_but_vllm_cpu_has_no_fp8_moe_backend(vllm_reports):
    """Why docs/interop.md says 'generates: no' for MoE families on CPU: the weights load, and only
    the FP8 fused-MoE kernel is missing from the CPU build (fused_moe/oracle/fp8.py)."""
    for case in ("deepseek_v3-fp8-dynamic", "glm4_moe-fp8-dynamic", "qwen3_next-fp8-dynamic"):
        errors = dict(vllm_reports[case]["process_errors"])
        if AMX:  # vLLM's CPU build on an AMX CPU serves MLA with its AMX backend
            # (vllm/v1/attention/backends/mla/amx_mla.py, `uses_amx_bmm`), whose packed W_UK/W_UV bmm
            # refuses the tiny model's 16-wide heads at load ("invalid weight input features 16", from
            # _C's bmm_cpu packing): a limit of that kernel for this toy shape, not of the artifact
            errors = {n: e for n, e in errors.items()
                      if not (n.endswith(".mla_attn") and "invalid weight input features" in e)}
        assert errors and all("Unsupported FP8 MoE backend" in e for e in errors.values()), (case, errors)
        assert all(n.endswith(".experts.routed_experts") for n in errors), errors
    assert not vllm_reports["qwen3-fp8-dynamic"]["process_errors"]


def test_vllm_serves_fp8_static_fused_groups_as_written(vllm_reports):
    """vLLM requantizes a fused q/k/v or gate/up group to its largest per-tensor scale
    (w8a8_utils.requantize_with_max_scale); tfcompile writes every member with that one scale
    (kernels/formats/quantizer.py FP8Weights.group_global_scale), so what is served is what is
    written (issue 26 item 2; tests/interop/test_fp8_fused_scales.py checks the bytes without vLLM)."""
    rep = vllm_reports["llama-fp8"]
    fused = {k: v for k, v in rep["loaded_scales"].items() if k.endswith(".weight_scale") and len(v) > 1}
    assert fused, "no fused per-tensor FP8 layer loaded"
    unequal = {k: v for k, v in fused.items() if len(set(v)) > 1}
    assert not unequal, f"{len(unequal)} fused layers with unequal member scales, served at their max: " \
                        + "; ".join(f"{k}: {v} -> {rep['served_scales'][k]}" for k, v in list(unequal.items())[:3])


# the MTP draft model vLLM 0.32 builds for each layout (speculative_config {"method": "mtp"})
MTP_DRAFT = {"deepseek_v3": "DeepSeekMTP", "deepseek_v32": "DeepSeekMTP", "glm4_moe": "Glm4MoeMTP",
             "qwen3_5": "Qwen3_5MTP", "qwen3_5_moe": "Qwen3_5MoeMTP"}


@pytest.mark.parametrize("case", list(MTP_CASES))
def test_vllm_mtp_draft_loads_every_mtp_tensor(case, vllm_reports, engine_artifact):
    """The MTP layers are kept with the names, shapes and dtypes vLLM's MTP loaders read: vLLM's own
    draft model (deepseek_mtp.py, glm4_moe_mtp.py, qwen3_5_mtp.py) takes every tensor of the MTP layer
    (the target model skips them), its heads (eh_proj nn.Linear, shared_head.head ParallelLMHead,
    Qwen3.5's mtp.fc) unquantized, its decoder block with the manifest's scheme (the scheme test)."""
    import json

    rep = vllm_reports[case]
    assert "error" not in rep, f"{case}: {rep.get('error')}\n{rep.get('traceback', '')}"
    cfg = json.loads((engine_artifact(case) / "config.json").read_text())
    text = cfg.get("text_config") or cfg
    prefix = "mtp." if "mtp_num_hidden_layers" in text else f"model.layers.{text['num_hidden_layers']}."
    assert rep["mtp"]["model_class"] == MTP_DRAFT[case.split("+")[0]]
    mtp = {t["name"] for t in rep["tensors"] if t["name"].startswith(prefix)}
    assert len(mtp) > 20, sorted(mtp)  # the whole layer is in the artifact
    missing = mtp - set(rep["mtp"]["tensors_loaded"])
    assert not missing, f"{case}: MTP tensors vLLM's draft model does not load: {sorted(missing)[:10]}"
    heads = [n for n in rep["linears"] if n.startswith(prefix) and n.endswith(("eh_proj", "shared_head.head", "mtp.fc"))]
    assert heads and all(rep["linears"][n]["scheme"] is None for n in heads), {n: rep["linears"][n] for n in heads}
