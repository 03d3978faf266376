"""tfcompile.runtime on CPU: the emulated kernel path equals the reference dequantized Linear."""

from __future__ import annotations

import pytest
import torch

from tfcompile.errors import UserError
from tfcompile.runtime import QuantLinear, load_artifact

FORMATS = ["nvfp4", "nvfp4a16", "mxfp4", "mxfp8", "fp8", "fp8-dynamic", "fp8-block"]


@pytest.mark.parametrize("fmt", FORMATS)
def test_quant_linear_equals_reference_dequantized_linear(runtime_artifact, fmt):
    from tfcompile.evaluate.models import load_candidate

    path = runtime_artifact(fmt)
    art = load_artifact(path, "cpu")
    assert art.kernels == "emulated" and art.scheme.name == fmt and not art.warnings
    ref = load_candidate(path, torch.float32, kv_cache="off")  # `tfcompile eval`'s artifact model
    assert set(art.linears) == set(ref.linears) and len(art.linears) == 14
    gen = torch.Generator().manual_seed(0)
    for name, ql in art.linears.items():
        assert isinstance(ql, QuantLinear) and ql.kernels == "emulated"
        x = torch.randn(2, 5, ql.in_features, generator=gen) * 3
        mod = ref.linears[name].module  # nn.Linear with the dequantized weight + activation pre-hook
        assert torch.equal(ql(x), mod(x)), name
        assert ql(x[:, :0]).shape == (2, 0, ql.out_features)
        xb = x.to(torch.bfloat16)
        assert ql(xb).dtype == torch.bfloat16


def test_installed_model_gives_the_reference_logits(runtime_artifact):
    from tfcompile.evaluate.models import load_candidate

    path = runtime_artifact("nvfp4")
    ref = load_candidate(path, torch.float32, kv_cache="off")
    model = load_candidate(path, torch.float32, kv_cache="off").model
    art = load_artifact(path)
    assert art.install(model) == []
    assert sum(isinstance(m, QuantLinear) for m in model.modules()) == 14
    ids = torch.randint(4, 200, (2, 12), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert torch.equal(model(ids).logits, ref.model(ids).logits)


def test_backend_choice_and_errors(runtime_artifact):
    path = runtime_artifact("nvfp4a16")
    with pytest.raises(UserError, match="unknown kernels"):
        load_artifact(path, kernels="cuda")
    for kernels in ("triton", "cutlass", "auto"):
        with pytest.raises(UserError, match="needs a CUDA device"):
            load_artifact(path, "cpu", kernels=kernels, require=True)
    assert load_artifact(path, "cpu", kernels="triton").kernels == "emulated"  # preferred, not required
    with pytest.raises(UserError, match="not a tfcompile artifact"):
        load_artifact(path / "tfcompile")


def test_moving_a_quant_linear_rebuilds_its_caches(runtime_artifact):
    art = load_artifact(runtime_artifact("fp8"))
    ql = art.linears["model.layers.0.mlp.down_proj"]
    x = torch.randn(3, ql.in_features)
    y = ql(x)
    assert ql._act is not None and ql._w
    ql._apply(lambda t: t.clone())  # what .to(device) does: new buffers
    assert ql._act is None and not ql._w  # the activation scale and weights are taken from the new buffers
    assert torch.equal(ql(x), y)
