"""Fuzzing `tfcompile quantize` with hypothesis over what a user hands it: safetensors headers,
index files, config.json and recipes (issue 16, build list).

Every generated input must end in exit 0 with an artifact that `tfcompile verify` passes, or
exit 1 with `error:` and `hint:` lines; never exit 2 or a traceback, never past a time bound,
and a run leaves nothing at OUT (when it failed), next to it, or in TMPDIR (fuzz_helpers.py).
The runs are in-process on a one-layer model with a weight-only format (no calibration),
bounded by `max_examples` and derandomized, so the module is reproducible; with
test_safety_fuzz_json.py (deep, huge and odd-typed JSON everywhere, FIFOs and devices, sizes at
the limits) it runs in under two minutes on two cores (docs/cli.md "Safety").
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import struct
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fuzz_helpers import JSON_ANY, JSON_LEAF, quantize_outcome

# A named profile: 30 examples per input kind keep the module near a minute on 2 cores (CI);
# TFCOMPILE_FUZZ_EXAMPLES=500 fuzzes deeper locally. Derandomized: every run tries the same inputs.
settings.register_profile("tfcompile-fuzz", max_examples=int(os.environ.get("TFCOMPILE_FUZZ_EXAMPLES", "30")),
                          deadline=None, derandomize=True, database=None, print_blob=True,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
FUZZ = settings.get_profile("tfcompile-fuzz")
WEIGHTS = "model.safetensors"
FORMATS = ("fp8-dynamic", "nvfp4a16", "mxfp8")


@pytest.fixture(scope="module")
def tiny_src(model_factory, tmp_path_factory) -> Path:
    return model_factory.make_tiny_llama(tmp_path_factory.mktemp("fuzz") / "m", hidden=64, intermediate=128,
                                         layers=1, heads=2, kv_heads=1, vocab=128)


@contextlib.contextmanager
def _copy(src: Path, cases: Path):
    with tempfile.TemporaryDirectory(prefix="tfc-fuzz-", dir=cases) as d:  # not in TMPDIR: that must stay empty
        dst = Path(d) / "model"
        shutil.copytree(src, dst)
        yield dst


# ---- strategies

INTS = st.one_of(st.sampled_from([-1, 0, 1, 2, 3, 7, 64, 128, 2**31, 2**63, 10**9]), st.integers(-2**70, 2**70))
DTYPES = st.sampled_from(["BF16", "BF16", "F16", "F32", "F64", "I8", "U8", "F8_E4M3", "BOOL", "I64", "bf16", "",
                          "F4"])


def _header_and_data(path: Path) -> tuple[dict, bytes]:
    raw = path.read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    return json.loads(raw[8:8 + n]), raw[8 + n:]


@st.composite
def header_edits(draw, names: list[str]):
    """A list of edits to the safetensors header (or raw bytes), applied in order: benign ones
    (valid metadata, the same dtype) reach quantization, the others stop at some check."""
    edit = st.one_of(
        st.tuples(st.just("metadata"), st.none(), st.dictionaries(st.text(max_size=8), st.text(max_size=8),
                                                                 max_size=3)),
        st.tuples(st.just("dtype"), st.sampled_from(names), DTYPES),
        st.tuples(st.just("shape"), st.sampled_from(names), st.lists(INTS, max_size=4)),
        st.tuples(st.just("swap"), st.sampled_from(names), st.none()),
        st.tuples(st.just("offsets"), st.sampled_from(names), st.lists(INTS, max_size=3)),
        st.tuples(st.just("drop"), st.sampled_from(names), st.none()),
        st.tuples(st.just("rename"), st.sampled_from(names), st.text(max_size=40)),
        st.tuples(st.just("entry"), st.sampled_from(names), JSON_ANY),
        st.tuples(st.just("metadata"), st.none(), JSON_ANY),
        st.tuples(st.just("truncate"), st.none(), st.integers(0, 4096)),
        st.tuples(st.just("length"), st.none(), st.integers(0, 2**64 - 1)),
        st.tuples(st.just("replace"), st.none(), JSON_ANY),
    )
    return draw(st.lists(edit, min_size=0, max_size=3))


def _apply_header_edits(path: Path, edits) -> None:
    header, data = _header_and_data(path)
    length_override = None
    for kind, name, value in edits:
        if kind == "replace":
            header = value
        elif not isinstance(header, dict):
            continue
        elif kind in ("dtype", "shape", "offsets") and isinstance(header.get(name), dict):
            header[name][{"dtype": "dtype", "shape": "shape", "offsets": "data_offsets"}[kind]] = value
        elif kind == "swap" and isinstance(header.get(name), dict) and isinstance(header[name].get("shape"), list):
            header[name]["shape"] = header[name]["shape"][::-1]  # same byte size, transposed
        elif kind == "drop":
            header.pop(name, None)
        elif kind == "rename" and name in header:
            header[value] = header.pop(name)
        elif kind == "entry":
            header[name] = value
        elif kind == "metadata":
            header["__metadata__"] = value
        elif kind == "truncate":
            data = data[: max(0, len(data) - value)]
        elif kind == "length":
            length_override = value
    body = json.dumps(header).encode()
    body += b" " * (-len(body) % 8)
    path.write_bytes(struct.pack("<Q", len(body) if length_override is None else length_override) + body + data)


CONFIG_KEYS = ("num_hidden_layers", "hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads",
               "vocab_size", "max_position_embeddings", "head_dim", "rms_norm_eps", "rope_theta",
               "tie_word_embeddings", "architectures", "model_type", "rope_scaling", "hidden_act",
               "attention_bias", "mlp_bias", "torch_dtype", "dtype", "quantization_config", "text_config",
               "pad_token_id", "initializer_range")
PLAUSIBLE = st.sampled_from([1, 2, 64, 128, 256, 1e-5, 1e-6, 10000.0, 500000.0, True, False, None, "silu", "gelu",
                             "llama", ["LlamaForCausalLM"], "bfloat16", "float32"])
CONFIG_VALUES = st.one_of(PLAUSIBLE, PLAUSIBLE, PLAUSIBLE, PLAUSIBLE, INTS, JSON_LEAF, st.lists(st.one_of(st.text(max_size=20), INTS), max_size=3),
                          st.sampled_from([["LlamaForCausalLM"], ["MistralForCausalLM"], ["BertModel"], "llama",
                                           "qwen3_moe", {"rope_type": "linear", "factor": -1}]), JSON_ANY)

RECIPE_PASSES = ("load", "select", "quantize", "pack", "manifest", "verify", "calibrate", "frobnicate")
RECIPE_FIELDS = ("format", "ignore", "algorithm", "max_shard_mb", "export", "strict", "checksums",
                 "use_default_ignore", "fuse_groups", "hash_cache", "allow_unknown_architecture", "bogus")
SET_FIELDS = [("pack", "max_shard_mb"), ("select", "ignore"), ("quantize", "algorithm"), ("verify", "strict"),
              ("pack", "hash_cache"), ("select", "fuse_groups"), ("select", "format"), ("frobnicate", "x"),
              ("load", "allow_unknown_architecture")]
RECIPE_VALUES = st.one_of(st.sampled_from(["nvfp4a16", "fp8-dynamic", "rtn", "mse", "gptq", "int3", "modelopt",
                                           "re:(", "*q_proj", "inf", "NaN"]),
                          st.sampled_from([0, 1, 2, -1, 0.5, 1e-300, 1e300, True, False, None]),
                          st.lists(st.sampled_from(["modelopt", "onnx", "x", "*proj"]), max_size=2), JSON_LEAF)


@st.composite
def recipes(draw):
    """A valid recipe with zero to two mutations, as (suffix, bytes)."""
    if draw(st.integers(0, 12)) == 0:
        return draw(st.sampled_from([".toml", ".json"])), draw(st.binary(max_size=200))
    doc: dict = {"version": 1, "format": draw(st.sampled_from(FORMATS)),
                 "passes": {"pack": {"max_shard_mb": 1}, "select": {"ignore": ["*o_proj"]}}}
    for kind in draw(st.lists(st.sampled_from(["version", "format", "pipeline", "passes", "table", "field",
                                               "field", "field", "drop", "junk"]), max_size=2)):
        passes = doc.get("passes") if isinstance(doc.get("passes"), dict) else None
        if kind == "version":
            doc["version"] = draw(st.one_of(st.sampled_from([1, 2, "1", None, 1.0]), JSON_LEAF))
        elif kind == "format":
            doc["format"] = draw(st.one_of(st.sampled_from(FORMATS + ("int3", "nvfp4", "")), JSON_LEAF))
        elif kind == "pipeline":
            doc["pipeline"] = draw(st.one_of(st.lists(st.sampled_from(RECIPE_PASSES[:6]), max_size=6),
                                             st.just(["load", "select", "quantize", "pack", "manifest", "verify"]),
                                             JSON_ANY))
        elif kind == "passes":
            doc["passes"] = draw(JSON_ANY)
        elif kind == "table" and passes is not None:
            passes[draw(st.sampled_from(RECIPE_PASSES))] = draw(st.one_of(JSON_LEAF, st.dictionaries(
                st.sampled_from(RECIPE_FIELDS), RECIPE_VALUES, max_size=2)))
        elif kind == "field" and passes is not None:
            table = passes.setdefault(draw(st.sampled_from(RECIPE_PASSES)), {})
            if isinstance(table, dict):
                table[draw(st.sampled_from(RECIPE_FIELDS))] = draw(RECIPE_VALUES)
        elif kind == "drop":
            doc.pop(draw(st.sampled_from(["version", "format", "passes"])), None)
        elif kind == "junk":
            doc[draw(st.text(max_size=6))] = draw(JSON_LEAF)
    return ".json", json.dumps(doc, allow_nan=True).encode()


# ---- the fuzz tests

@FUZZ
@given(data=st.data())
def test_fuzz_safetensors_header(tiny_src, fuzz_dirs, data):
    edits = data.draw(header_edits(_names(tiny_src)))
    fmt = data.draw(st.sampled_from(FORMATS))
    with _copy(tiny_src, fuzz_dirs[0]) as model:
        _apply_header_edits(model / WEIGHTS, edits)
        quantize_outcome(model, fuzz_dirs[1], "--format", fmt)


@FUZZ
@given(data=st.data())
def test_fuzz_index_file(tiny_src, fuzz_dirs, data):
    names = _names(tiny_src)
    shard = data.draw(st.sampled_from(["model-00001-of-00001.safetensors", "a.safetensors"]))
    weight_map: object = {n: shard for n in names}
    bad_value = st.one_of(st.sampled_from(["../model.safetensors", "/etc/passwd", "", ".", "missing.safetensors",
                                           "config.json", "a/b.safetensors"]), JSON_LEAF)
    for kind in data.draw(st.lists(st.sampled_from(["value", "drop", "extra", "whole"]), max_size=2)):
        if not isinstance(weight_map, dict):
            break
        if kind == "value":
            weight_map[data.draw(st.sampled_from(names))] = data.draw(bad_value)
        elif kind == "drop":
            weight_map.pop(data.draw(st.sampled_from(names)), None)
        elif kind == "extra":
            weight_map[data.draw(st.text(max_size=10))] = data.draw(st.one_of(st.just(shard), bad_value))
        else:
            weight_map = data.draw(JSON_ANY)
    index = data.draw(st.one_of(st.fixed_dictionaries({"metadata": JSON_ANY, "weight_map": st.just(weight_map)}),
                                st.fixed_dictionaries({"weight_map": st.just(weight_map)}), st.just(weight_map)))
    with _copy(tiny_src, fuzz_dirs[0]) as model:
        (model / WEIGHTS).rename(model / shard)
        (model / "model.safetensors.index.json").write_text(json.dumps(index, allow_nan=True))
        quantize_outcome(model, fuzz_dirs[1], "--format", "fp8-dynamic")


def _names(model: Path) -> list[str]:
    from safetensors import safe_open

    with safe_open(model / WEIGHTS, "pt") as f:
        return sorted(f.keys())


@FUZZ
@given(changes=st.dictionaries(st.sampled_from(CONFIG_KEYS), CONFIG_VALUES, min_size=1, max_size=3),
       drop=st.lists(st.sampled_from(CONFIG_KEYS), max_size=2), fmt=st.sampled_from(FORMATS))
def test_fuzz_config(tiny_src, fuzz_dirs, changes, drop, fmt):
    with _copy(tiny_src, fuzz_dirs[0]) as model:
        cfg = json.loads((model / "config.json").read_text())
        for k in drop:
            cfg.pop(k, None)
        cfg.update(changes)
        (model / "config.json").write_text(json.dumps(cfg, allow_nan=True))
        quantize_outcome(model, fuzz_dirs[1], "--format", fmt)


@FUZZ
@given(recipe=recipes(), with_format=st.booleans(),
       sets=st.lists(st.tuples(st.sampled_from(SET_FIELDS),
                               st.sampled_from(["1", "0", "-1", "inf", "NaN", "x", "[1]", "true", "{}", "", "0.5",
                                                "rtn", "mse", "*down_proj", "re:(", "false"])), max_size=2))
def test_fuzz_recipe(tiny_src, fuzz_dirs, recipe, with_format, sets):
    suffix, body = recipe
    with _copy(tiny_src, fuzz_dirs[0]) as model:
        path = model.parent / f"recipe{suffix}"
        path.write_bytes(body)
        extra = ["--recipe", path] + (["--format", "fp8-dynamic"] if with_format else [])
        for (name, field), value in sets:
            extra += ["--set", f"{name}.{field}={value}"]
        quantize_outcome(model, fuzz_dirs[1], *extra)
