"""Fuzzing every JSON tfcompile reads with deep, huge and odd-typed values, every file it reads
as a FIFO or a device, and sizes at the limits (issue 24, build list; fuzz_helpers.py has the
contract: exit 0 with a verified artifact or exit 1 with a message, never a traceback or a
hang, nothing left at OUT or in TMPDIR).

Read by quantize: config.json, the index, the safetensors header, a recipe, `--set` values.
Read from an artifact by inspect, report and verify: the manifest (any field, resealed or not,
so the type checks behind the digest are reached too), tfcompile/kv_cache.json,
kernels/index.json, manifest.sig; and `report --eval` documents. Derandomized; the whole
fuzz (this module and test_safety_fuzz.py) takes under two minutes on two cores
(docs/cli.md "Safety" has the measured figure).
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fuzz_helpers import ODD_TEXT, check, deep_text, paths_of, quantize_outcome, render, run

settings.register_profile("tfcompile-fuzz-json", max_examples=int(os.environ.get("TFCOMPILE_FUZZ_EXAMPLES", "40")),
                          deadline=None, derandomize=True, database=None, print_blob=True,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                                 HealthCheck.function_scoped_fixture])
FUZZ = settings.get_profile("tfcompile-fuzz-json")
WEIGHTS = "model.safetensors"
EVAL = {"ok": True, "metrics": {"perplexity": 2.0, "reference_perplexity": 1.9, "ppl_increase": 0.05,
                                "kl_mean": 0.01, "kl_max": 0.1, "top1_agreement": 0.9, "tokens": 64},
        "text": {"source": "file:x", "sequences": 1}, "gates": []}
RECIPE = {"version": 1, "format": "fp8-dynamic", "pipeline": ["load", "select", "quantize", "pack", "manifest",
                                                              "verify"],
          "passes": {"pack": {"max_shard_mb": 1}, "select": {"ignore": ["*o_proj"]}}}
SET_FIELDS = ("pack.max_shard_mb", "select.ignore", "quantize.algorithm", "verify.strict", "select.format",
              "load.allow_unknown_architecture", "calibrate.samples")


@pytest.fixture(scope="module")
def tiny_src(model_factory, tmp_path_factory) -> Path:
    return model_factory.make_tiny_llama(tmp_path_factory.mktemp("fuzzjson") / "m", hidden=64, intermediate=128,
                                         layers=1, heads=2, kv_heads=1, vocab=128)


@pytest.fixture(scope="module")
def keys(ed25519_keys):
    return ed25519_keys


@pytest.fixture(scope="module")
def signed(tiny_src, tmp_path_factory, keys) -> Path:
    """A signed artifact with a KV-cache descriptor (--layout vllm): every file kind to damage."""
    out = tmp_path_factory.mktemp("signed") / "art"
    code, _, err = run("quantize", tiny_src, "-o", out, "--format", "nvfp4a16", "--layout", "vllm", "-q",
                       "--sign", keys[0])
    assert code == 0 and (out / "tfcompile" / "kv_cache.json").is_file(), err
    return out


def _add_kernel_index(art: Path) -> None:
    """kernels/index.json as report reads it (unlisted here: verify fails on it, report reads it)."""
    (art / "kernels").mkdir(exist_ok=True)
    (art / "kernels" / "index.json").write_text(json.dumps({"targets": {}, "kernels": []}))


def _copy(src: Path, cases: Path) -> Path:
    return Path(shutil.copytree(src, Path(tempfile.mkdtemp(prefix="tfc-fuzz-", dir=cases)) / "x", symlinks=True))


def _header(path: Path) -> tuple[dict, bytes]:
    raw = path.read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    return json.loads(raw[8:8 + n]), raw[8 + n:]


# ---- what quantize reads

def _source_case(draw, model: Path) -> list[str]:
    """Put odd JSON text somewhere in one input of `model`; the extra quantize arguments."""
    where = draw(st.sampled_from(["config", "index", "header", "recipe", "set"]))
    text = draw(ODD_TEXT)
    if where == "config":
        cfg = json.loads((model / "config.json").read_text())
        path = draw(st.sampled_from(paths_of(cfg, 2) + [("extra",), ("text_config", "num_hidden_layers")]))
        (model / "config.json").write_text(render(cfg, path, text))
    elif where == "index":
        header, _ = _header(model / WEIGHTS)
        index = {"metadata": {"total_size": 1}, "weight_map": {n: WEIGHTS for n in header if n != "__metadata__"}}
        path = draw(st.sampled_from(paths_of(index, 2)))
        (model / "model.safetensors.index.json").write_text(render(index, path, text))
    elif where == "header":
        header, data = _header(model / WEIGHTS)
        path = draw(st.sampled_from(paths_of(header, 2)))
        body = render(header, path, text).encode()
        (model / WEIGHTS).write_bytes(struct.pack("<Q", len(body)) + body + data)
    elif where == "recipe":
        path = draw(st.sampled_from(paths_of(RECIPE, 3)))
        (model.parent / "r.json").write_text(render(RECIPE, path, text))
        return ["--recipe", model.parent / "r.json"]
    else:
        return ["--format", "fp8-dynamic", "--set", f"{draw(st.sampled_from(SET_FIELDS))}={text}"]
    return ["--format", "fp8-dynamic"]


@FUZZ
@given(data=st.data())
def test_fuzz_odd_json_in_what_quantize_reads(tiny_src, fuzz_dirs, data):
    model = _copy(tiny_src, fuzz_dirs[0])
    extra = _source_case(data.draw, model)
    quantize_outcome(model, fuzz_dirs[1], *extra)
    shutil.rmtree(model.parent)


@FUZZ
@given(data=st.data())
def test_fuzz_odd_json_in_the_config_plan_estimates(tiny_src, fuzz_dirs, data):
    """`plan --estimate` reads config.json alone (no weights): odd values at any key, bounded."""
    work = Path(tempfile.mkdtemp(dir=fuzz_dirs[0]))
    cfg = json.loads((tiny_src / "config.json").read_text())
    path = data.draw(st.sampled_from(paths_of(cfg, 2) + [("n_layers",), ("num_local_experts",), ("text_config",)]))
    (work / "config.json").write_text(render(cfg, path, data.draw(ODD_TEXT)))
    devices = data.draw(st.sampled_from(["1xH200", "8xH200", "0xH200", "3xB200", "1e3xH200", "x"]))
    code, stdout, err = run("plan", work / "config.json", "--format", "nvfp4", "--estimate", "--devices", devices,
                            bound=30)
    check(code, stdout, err, fuzz_dirs[1])
    shutil.rmtree(work)


# ---- what inspect, report and verify read from an artifact

def _damage(draw, art: Path) -> None:
    from tfcompile.artifact.integrity import seal

    what = draw(st.sampled_from(["manifest", "manifest", "manifest", "kv", "kernels", "sig"]))
    rel = {"manifest": "tfcompile/manifest.json", "kv": "tfcompile/kv_cache.json", "kernels": "kernels/index.json",
           "sig": "tfcompile/manifest.sig"}[what]
    if what == "kernels":
        _add_kernel_index(art)
    doc = json.loads((art / rel).read_text())
    path = draw(st.sampled_from(paths_of(doc, 4)))
    if what == "manifest" and draw(st.booleans()):  # a value that parses, digest recomputed: past the seal
        try:
            value = json.loads(draw(ODD_TEXT))
            doc = json.loads(render(doc, path, json.dumps(value, allow_nan=True)))
            text = json.dumps(seal(doc) if isinstance(doc, dict) else doc, allow_nan=True)
        except (ValueError, RecursionError):  # not parseable here either: write it raw
            text = render(doc, path, draw(ODD_TEXT))
    else:
        text = render(doc, path, draw(ODD_TEXT))
    (art / rel).write_text(text)


@FUZZ
@given(data=st.data())
def test_fuzz_odd_json_in_what_inspect_report_verify_read(signed, keys, fuzz_dirs, data):
    art = _copy(signed, fuzz_dirs[0])
    _damage(data.draw, art)
    page = art.parent / "r.html"
    for args in (["inspect", art], ["inspect", art, "--json"], ["report", art, "-o", page], ["verify", art],
                 ["verify", art, "--public-key", keys[1]]):
        code, stdout, err = run(*args)
        check(code, stdout, err, fuzz_dirs[1], page if args[0] == "report" else None)
        page.unlink(missing_ok=True)
    shutil.rmtree(art.parent)


@FUZZ
@given(path=st.sampled_from(paths_of(EVAL, 3)), text=ODD_TEXT)
def test_fuzz_odd_json_in_an_eval_document(signed, fuzz_dirs, path, text):
    work = Path(tempfile.mkdtemp(dir=fuzz_dirs[0]))
    (work / "eval.json").write_text(render(EVAL, path, text))
    code, stdout, err = run("report", signed, "--eval", work / "eval.json", "-o", work / "r.html")
    check(code, stdout, err, fuzz_dirs[1], work / "r.html")
    shutil.rmtree(work)


# ---- FIFOs and devices where a file is read

SPECIAL = {"fifo": os.mkfifo, "dev-zero": lambda p: os.symlink("/dev/zero", p),
           "dev-null": lambda p: os.symlink("/dev/null", p), "dir": os.mkdir}
# (what is replaced, relative to the source model `m`, the artifact `a` or the work dir; the command)
SITES = [("m/config.json", "quantize"), ("m/model.safetensors", "quantize"), ("m/tokenizer.json", "quantize"),
         ("m/model.safetensors.index.json", "quantize"), ("recipe.json", "quantize --recipe"),
         ("key.pem", "quantize --sign"), ("a/tfcompile/manifest.json", "inspect"),
         ("a/tfcompile/manifest.json", "verify"), ("a/tfcompile/manifest.sig", "verify --public-key"),
         ("pub.pem", "verify --public-key"), ("a/tfcompile/kv_cache.json", "report"),
         ("a/kernels/index.json", "report"), ("eval.json", "report --eval"), ("a/config.json", "export-onnx"),
         ("calib.txt", "quantize --calib"), ("text.txt", "eval --text")]


@pytest.mark.parametrize("kind", sorted(SPECIAL))
@pytest.mark.parametrize("site,command", SITES, ids=[f"{s}:{c}" for s, c in SITES])
def test_fifos_and_devices_are_refused_at_once(site, command, kind, tiny_src, signed, keys, fuzz_dirs):
    work = Path(tempfile.mkdtemp(dir=fuzz_dirs[0]))
    model, art = _copy(tiny_src, work), _copy(signed, work)
    model.rename(work / "m")
    art.rename(work / "a")
    _add_kernel_index(work / "a")
    target = work / site
    if site.endswith(".index.json"):
        (work / "m" / WEIGHTS).rename(work / "m" / "model-00001-of-00001.safetensors")
    if os.path.lexists(target):
        shutil.rmtree(target) if target.is_dir() and not target.is_symlink() else target.unlink()
    target.parent.mkdir(parents=True, exist_ok=True)
    SPECIAL[kind](target)
    out = work / "out"
    args = {"quantize": ["quantize", work / "m", "-o", out, "--format", "fp8-dynamic", "-q"],
            "quantize --recipe": ["quantize", work / "m", "-o", out, "--recipe", target, "-q"],
            "quantize --sign": ["quantize", work / "m", "-o", out, "--format", "fp8-dynamic", "-q", "--sign", target],
            "inspect": ["inspect", work / "a"], "verify": ["verify", work / "a"],
            "verify --public-key": ["verify", work / "a", "--public-key",
                                    target if site == "pub.pem" else keys[1]],
            "report": ["report", work / "a", "-o", out], "report --eval": ["report", work / "a", "--eval", target,
                                                                           "-o", out],
            "export-onnx": ["export-onnx", work / "a", "-o", out],
            "quantize --calib": ["quantize", work / "m", "-o", out, "--format", "fp8", "-q", "--calib", target,
                                 "--set", "calibrate.samples=2", "--set", "calibrate.seq_len=8"],
            "eval --text": ["eval", work / "a", "--reference", work / "m", "--text", target]}[command]
    code, stdout, err = run(*args, bound=30)
    check(code, stdout, err, fuzz_dirs[1], out)
    assert code == 1, f"{site} as a {kind} was accepted by {command}: {err}"
    shutil.rmtree(work)


# ---- sizes at the limits

def _padded(doc: dict, size: int) -> bytes:
    body = json.dumps(doc).encode()
    return body + b" " * (size - len(body))


@pytest.mark.parametrize("over", [False, True], ids=["at", "over"])
@pytest.mark.parametrize("what", ["recipe", "config", "eval"])
def test_files_at_and_over_the_size_limit(what, over, tiny_src, signed, fuzz_dirs):
    from tfcompile.io.bounded import SMALL

    work = Path(tempfile.mkdtemp(dir=fuzz_dirs[0]))
    model = _copy(tiny_src, work)
    size = SMALL + over
    if what == "recipe":
        (work / "r.json").write_bytes(_padded(RECIPE, size))
        args = ["quantize", model, "-o", work / "out", "--recipe", work / "r.json", "-q"]
    elif what == "config":
        (model / "config.json").write_bytes(_padded(json.loads((model / "config.json").read_text()), size))
        args = ["quantize", model, "-o", work / "out", "--format", "fp8-dynamic", "-q"]
    else:
        (work / "e.json").write_bytes(_padded(EVAL, size))
        args = ["report", signed, "--eval", work / "e.json", "-o", work / "out"]
    code, stdout, err = run(*args)
    check(code, stdout, err, fuzz_dirs[1], work / "out")
    assert code == (1 if over else 0), err
    if over:
        assert f"{SMALL:,}-byte limit" in err, err
    shutil.rmtree(work)


@pytest.mark.parametrize("depth", [63, 64, 65])
def test_json_at_and_over_the_depth_limit(depth, tiny_src, fuzz_dirs):
    """64 levels pass the depth check (and then fail the type check: a list is no shard size),
    65 fail it; both exit 1 with a message, in a recipe and in a --set value."""
    work = Path(tempfile.mkdtemp(dir=fuzz_dirs[0]))
    model = _copy(tiny_src, work)
    (work / "r.json").write_text(render(RECIPE, ("passes", "pack", "max_shard_mb"), deep_text(depth - 3, "list")))
    for extra in (["--recipe", work / "r.json"], ["--format", "fp8-dynamic", "--set",
                                                  f"pack.max_shard_mb={deep_text(depth, 'list')}"]):
        code, stdout, err = run("quantize", model, "-o", work / "out", "-q", *extra)
        check(code, stdout, err, fuzz_dirs[1], work / "out")
        assert code == 1 and (("nested deeper than 64" in err) == (depth > 64)), err
    shutil.rmtree(work)


def test_a_public_key_at_and_over_the_size_limit(signed, keys, fuzz_dirs):
    from tfcompile.io.bounded import KEY

    work = Path(tempfile.mkdtemp(dir=fuzz_dirs[0]))
    pem = keys[1].read_bytes()
    for size, code_ in ((KEY, 0), (KEY + 1, 1)):
        (work / "pub.pem").write_bytes(pem + b"\n" * (size - len(pem)))
        code, stdout, err = run("verify", signed, "--public-key", work / "pub.pem")
        check(code, stdout, err, fuzz_dirs[1])
        assert code == code_ and (("too large" in err) == (size > KEY)), err
    shutil.rmtree(work)
