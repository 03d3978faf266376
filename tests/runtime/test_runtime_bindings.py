"""The runtime's kernel path without a GPU: the artifact's emitted launch records (JSON) and
runtime/bindings.py drive the real Triton kernels under Triton's CPU interpreter, and the
result matches the emulated QuantLinear. Only loading the cubin itself needs a GPU."""

from __future__ import annotations

import pytest
import torch

from tfcompile.runtime import load_artifact
from tfcompile.runtime.cuda import KernelStore, LinearRunner


class _Interpreted:
    """Stands in for cuda.LoadedKernel: same record, launched by the interpreter twin."""

    def __init__(self, kdef, doc):
        self.kdef, self.doc = kdef, doc

    def launch(self, m: int, args: dict) -> None:
        from tfcompile.kernels.triton.interpret import launchable

        d = self.doc
        grid = tuple(self.kdef.grid(m, d["n"], d["k"], d["config"]))
        values = [args[a] if a in args else d["constexprs"][a] for a in d["arg_order"]]
        launchable(self.kdef.fn)[grid](*values, num_warps=d["num_warps"])


class _InterpStore(KernelStore):
    def get(self, stem: str):
        import json

        doc = json.loads((self.root / f"{stem}.json").read_text())
        if doc["kernel"].startswith("fp4_gemm_nvfp4"):
            pytest.skip("Triton 3.9's interpreter reads NVFP4's E4M3 block scales as E8M0")
        return _Interpreted(self.kernels[doc["kernel"]], doc)


@pytest.mark.slow
@pytest.mark.parametrize("fmt, target, gemm, act", [
    ("fp8", "sm_90a", "fp8_gemm_tensor", "act_quant_fp8_static"),
    ("fp8-dynamic", "sm_100a", "fp8_gemm_channel", "act_quant_fp8_token"),
    ("nvfp4a16", "sm_90a", "w4a16_gemm_nvfp4", None),
    ("mxfp4", "sm_100a", "fp4_gemm_mxfp4", "act_quant_mxfp4"),
])
def test_bindings_drive_the_real_kernels(runtime_artifact, fmt, target, gemm, act):
    from tfcompile.tune.registry import load_kernels

    kernels, _ = load_kernels()
    if gemm not in kernels or (act and act not in kernels):
        pytest.skip(f"{gemm} / {act} not registered")
    path = runtime_artifact(fmt, "--target", target, "--set", "emit.buckets=[1,16]")
    art = load_artifact(path, "cpu")
    store = _InterpStore(path, target, kernels)
    assert store.serving["gemm"] == [gemm] and store.serving["act_quant"] == ([act] if act else [])
    gen = torch.Generator().manual_seed(0)
    for name in ("model.layers.0.self_attn.k_proj", "model.layers.1.mlp.down_proj"):
        ql = art.linears[name]
        runner = LinearRunner(ql, store, gemm, act)
        assert sorted(runner.gemm_stems) == [1, 16]
        for m in (1, 5, 20):  # 20: above the largest bucket
            x = torch.randn(m, ql.in_features, generator=gen).to(torch.bfloat16)
            y = runner(x).float()
            ref = ql.emulated(x.float())
            rel = ((y - ref).norm() / ref.norm()).item()
            assert y.shape == (m, ql.out_features) and rel < 1e-2, (name, m, rel)


class _DictStore:
    """Launch records built here instead of read from an artifact: stem -> (KernelDef, doc)."""

    def __init__(self, docs: dict):
        self.docs = docs

    def stems(self, kernel: str, n: int, k: int) -> dict[int, str]:
        return {d["m_bucket"]: s for s, (_, d) in self.docs.items()
                if d["kernel"] == kernel and (d["n"], d["k"]) == (n, k)}

    def get(self, stem: str):
        return _Interpreted(*self.docs[stem])


def _doc(kdef, n: int, k: int, m: int, cfg: dict) -> dict:
    return {"kernel": kdef.name, "n": n, "k": k, "m_bucket": m, "config": cfg, "num_warps": cfg["num_warps"],
            "constexprs": kdef.constexprs(n, k, cfg), "arg_order": list(kdef.signature(n, k, cfg))}


@pytest.mark.slow
def test_split_k_gemm_and_its_reduction(runtime_artifact):
    from tfcompile.tune.registry import load_kernels

    kernels, _ = load_kernels()
    if "w4a16_gemm_nvfp4" not in kernels or "splitk_reduce" not in kernels:
        pytest.skip("w4a16_gemm_nvfp4 / splitk_reduce not registered")
    gemm, red = kernels["w4a16_gemm_nvfp4"], kernels["splitk_reduce"]
    ql = load_artifact(runtime_artifact("nvfp4a16")).linears["model.layers.0.mlp.down_proj"]  # 128 x 256
    n, k = ql.out_features, ql.in_features
    cfg = {"BLOCK_M": 16, "BLOCK_N": 64, "BLOCK_K": 64, "GROUP_M": 1, "SPLIT_K": 2, "SWAP_AB": True,
           "num_warps": 4, "num_stages": 2}
    rcfg = {**red.default_config, "SPLIT_K": 2}
    gdoc = dict(_doc(gemm, n, k, 16, cfg), followup={"kernel": red.name, "file": "r"})
    store = _DictStore({"g": (gemm, gdoc), "r": (red, _doc(red, n, k, 16, rcfg))})
    runner = LinearRunner(ql, store, gemm.name, None)
    x = torch.randn(5, k, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    y, ref = runner(x).float(), ql.emulated(x.float())
    assert ((y - ref).norm() / ref.norm()).item() < 1e-2
