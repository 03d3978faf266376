"""quantize.online_hadamard=B (tfcompile/rotate/online.py, passes/quantize/online.py): the transform is
orthogonal and the one compressed-tensors builds, the stored weight is W R, GPTQ on R^T H R beats RTN
under it, and what cannot serve it is refused naming the option, with a hint."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from tfcompile.artifact.engines import engine_problems
from tfcompile.kernels import formats as F
from tfcompile.kernels.formats.quantizer import weight_quantizer
from tfcompile.passes.quantize.gptq import gptq_quantize
from tfcompile.rotate import online

WQ = weight_quantizer("mxfp4", "group", (32,))
ON = ("--set", "quantize.online_hadamard=32")


def _dense(k: int, b: int) -> torch.Tensor:
    return torch.block_diag(*[online.matrix(b)] * (k // b))


def test_matrix_is_compressed_tensors_and_orthogonal():
    from compressed_tensors.transform.utils.hadamard import deterministic_hadamard_matrix

    h = online.matrix(32)
    assert torch.equal(h * 32 ** 0.5, deterministic_hadamard_matrix(32, torch.float64))
    assert torch.allclose(h @ h.T, torch.eye(32, dtype=torch.float64), atol=1e-12) and torch.equal(h, h.T)
    g = torch.Generator().manual_seed(0)
    w, a = torch.randn(8, 128, generator=g), torch.randn(128, 128, generator=g)
    r, hess = _dense(128, 32), a @ a.T
    assert torch.allclose(online.rotate_weight(w, 32).double(), w.double() @ r, atol=1e-5)
    assert torch.allclose(online.rotate_hessian(hess, 32).double(), r.T @ hess.double() @ r, rtol=1e-5, atol=1e-3)
    x = torch.randn(3, 128, generator=g)
    assert torch.allclose(online.transform_inputs(x, 32) @ online.rotate_weight(w, 32).T, x @ w.T, atol=1e-4)
    assert online.rotate_weight(w, 0) is w and online.rotate_hessian(hess, 0) is hess


def test_transform_config_is_compressed_tensors_dump():
    from compressed_tensors.transform import TransformConfig

    tc = online.transform_config(32, ["lm_head"])
    assert TransformConfig.model_validate(tc).model_dump() == tc
    assert online.input_transforms({"transform_config": tc}) == [(32, ["Linear"], ["lm_head"])]
    assert online.module_order(online.input_transforms({"transform_config": tc}), "model.layers.0.mlp.up_proj") == 32
    assert online.module_order(online.input_transforms({"transform_config": tc}), "lm_head") == 0
    bad = json.loads(json.dumps(tc))
    bad["config_groups"][online.SCHEME_NAME]["randomize"] = True
    with pytest.raises(online.UnsupportedTransform):
        online.input_transforms({"transform_config": bad})


@pytest.fixture(scope="module")
def on_grid(model_factory, tmp_path_factory):
    """A float32 tiny Llama whose every decoder Linear weight is Q R, Q on the MXFP4 grid: quantized as
    W R under the transform it must come back as Q exactly. Returns (checkpoint, {module: Q})."""
    src = model_factory.make_tiny_llama(tmp_path_factory.mktemp("grid") / "llama", dtype=torch.float32)
    tensors = load_file(src / "model.safetensors")
    grid, g = {}, torch.Generator().manual_seed(0)
    values = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])
    for name, w in tensors.items():
        if ".layers." in name and name.endswith("proj.weight"):
            n, k = w.shape
            q = values[torch.randint(0, 8, (n, k), generator=g)] * (torch.randint(0, 2, (n, k), generator=g) * 2 - 1)
            q[:, ::32] = 6.0  # every block's max is a 6 code: its E8M0 scale is unambiguous under rounding noise
            q = q * 2.0 ** torch.randint(-7, -3, (n, k // 32, 1), generator=g).repeat_interleave(32, 1).flatten(1)
            grid[name[: -len(".weight")]] = q
            tensors[name] = (q.double() @ _dense(q.shape[1], 32)).float().contiguous()
    save_file(tensors, src / "model.safetensors", metadata={"format": "pt"})
    return src, grid


def _decoded(out: Path) -> dict[str, torch.Tensor]:
    from tfcompile.artifact.naming import qtensor_of
    from tfcompile.io.checkpoint import open_checkpoint
    from tfcompile.schemes import get_scheme

    layers = json.loads((out / "tfcompile" / "manifest.json").read_text())["layers"]
    ckpt = open_checkpoint(out)
    try:
        return {la["module"]: F.dequantize(qtensor_of(ckpt, get_scheme("mxfp4a16"), la["module"], *la["shape"]),
                                           torch.float32) for la in layers}
    finally:
        ckpt.close()


def test_stored_weight_is_w_r(on_grid, run_cli, tmp_path):
    src, grid = on_grid
    assert run_cli("quantize", str(src), "-o", str(tmp_path / "on"), "--format", "mxfp4a16", "-q", *ON).code == 0
    got = _decoded(tmp_path / "on")
    assert sorted(got) == sorted(grid)
    for m, q in grid.items():
        assert torch.equal(got[m], q), m  # W R = Q R R = Q, on the grid: RTN keeps it exactly
    assert run_cli("quantize", str(src), "-o", str(tmp_path / "off"), "--format", "mxfp4a16", "-q").code == 0
    plain = _decoded(tmp_path / "off")
    assert not any(torch.equal(plain[m], q) for m, q in grid.items())  # without it, W itself is stored
    doc = json.loads((tmp_path / "on" / "tfcompile" / "manifest.json").read_text())
    assert doc["scheme"]["online_transform"] == online.record(32)
    assert all(la["online_hadamard"] == 32 for la in doc["layers"])
    qc = json.loads((tmp_path / "on" / "config.json").read_text())["quantization_config"]
    assert qc["transform_config"] == online.transform_config(32, ["lm_head"])
    assert json.loads((tmp_path / "off" / "config.json").read_text())["quantization_config"]["transform_config"] == {}


def test_gptq_on_rotated_hessian_beats_rtn():
    """Under the transform the layer computes (x R) Q^T: GPTQ with R^T H R cuts that output error well below
    RTN's, and below GPTQ handed the untransformed H (so the Hessian's rotation is no no-op)."""
    g = torch.Generator().manual_seed(0)
    k = 256
    w = torch.randn(96, k, generator=g)
    mix = torch.randn(k, k, generator=g) / k ** 0.5 + torch.eye(k) * 0.2
    x = torch.randn(2048, k, generator=g) @ mix * (1 + 4 * torch.rand(k, generator=g))
    h = x.T @ x / x.shape[0]
    wr, xr = online.rotate_weight(w, 32), online.transform_inputs(x, 32)
    q = WQ.quantize(wr, rule="floor")

    def err(qq):
        return (x @ w.T - xr @ F.dequantize(qq, torch.float32).T).pow(2).sum().item()

    rotated = gptq_quantize(wr, online.rotate_hessian(h, 32), q)
    unrotated = gptq_quantize(wr, h, q)
    assert err(rotated) < 0.5 * err(q), (err(rotated), err(q))
    assert err(rotated) < 0.8 * err(unrotated), (err(rotated), err(unrotated))


def test_gptq_artifact_beats_rtn_artifact(tiny_llama_src, run_cli, tmp_path):
    """The pipeline's GPTQ under the transform (pack's solve with the rotated Hessian) against its RTN, by
    tfcompile eval's isolated per-layer output SQNR on held-out text."""
    text = tmp_path / "text.txt"
    text.write_text(Path(__file__).read_text() * 4)
    sqnr = {}
    for algo in ("rtn", "gptq"):
        out = tmp_path / algo
        calib = ("--calib-samples", "8", "--calib-seq-len", "64", "--calib", "random") if algo == "gptq" else ()
        assert run_cli("quantize", str(tiny_llama_src), "-o", str(out), "--format", "mxfp4a16", "--algorithm",
                       algo, "-q", *calib, *ON).code == 0
        r = run_cli("eval", str(out), "--reference", str(tiny_llama_src), "--text", str(text), "--max-tokens", "512",
                    "--json")
        assert r.code == 0, r.err[-2000:]
        sqnr[algo] = [la["sqnr_db"] for la in r.json()["layers"]]
    assert sum(sqnr["gptq"]) / len(sqnr["gptq"]) > sum(sqnr["rtn"]) / len(sqnr["rtn"]) + 0.5, sqnr


@pytest.mark.parametrize("extra", [
    ("--format", "nvfp4"),  # static activation scales; blocks of 16
    ("--format", "fp8-dynamic"),  # no block scales
    ("--format", "mxfp4", "--set", "quantize.online_hadamard=24"),  # not a power of two
    ("--format", "mxfp4", "--algorithm", "awq"),
    ("--format", "mxfp4", "--export", "modelopt"),
    ("--format", "mxfp4", "--layout", "vllm"),
    ("--format", "mxfp4", "--algorithm", "gptq", "--set", "calibrate.propagate=true"),
])
def test_refusals_name_the_option(tiny_llama_src, run_cli, tmp_path, extra):
    r = run_cli("quantize", str(tiny_llama_src), "-o", str(tmp_path / "out"), *ON, *extra)
    assert r.code == 1, r.err[-2000:]
    assert "quantize.online_hadamard=" in r.err and "\nhint: " in r.err, r.err[-2000:]
    assert not (tmp_path / "out").exists()


def test_engines_that_cannot_serve_it():
    doc = {"scheme": {"name": "mxfp4a16", "online_transform": online.record(32)}, "family": "llama", "layers": []}
    assert not engine_problems(doc, "vllm")
    for engine, tp in (("sglang", 1), ("trtllm", 1), ("vllm", 2)):
        probs = engine_problems(doc, engine, tp=tp)
        assert len(probs) == 1 and probs[0].error and probs[0].hint, (engine, probs)


def test_readers_that_would_skip_the_transform_refuse(tiny_llama_src, run_cli, tmp_path):
    """The runtime's QuantLinear and the ONNX graph would run W R without x R: refused, with a hint."""
    from tfcompile.errors import UserError
    from tfcompile.runtime.loader import load_artifact

    out = tmp_path / "art"
    assert run_cli("quantize", str(tiny_llama_src), "-o", str(out), "--format", "mxfp4", "-q", *ON).code == 0
    with pytest.raises(UserError, match="online input transform") as e:
        load_artifact(out, "cpu")
    assert e.value.hint
    r = run_cli("export-onnx", str(out), "-o", str(tmp_path / "m.onnx"))
    assert r.code == 1 and "online input transform" in r.err and "\nhint: " in r.err, r.err[-2000:]


def test_plan_estimate_asks_the_engines_about_it(tiny_llama_src, run_cli):
    r = run_cli("plan", str(tiny_llama_src), "--format", "mxfp4a16", "--estimate", "--json", *ON)
    assert r.code == 0, r.err[-2000:]
    engines = r.json()["engines"]
    assert engines["sglang"]["verdict"] == "refuses" and engines["vllm"]["verdict"] != "refuses", engines
