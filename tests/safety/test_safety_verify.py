"""Issue 16, case 6: `verify` (and `inspect`, `eval`) on damaged or tampered artifacts: clear
failures instead of tracebacks, no path outside the artifact is ever read, extra files,
symlinks and manifest edits are reported, and `eval` checks checksums first."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest

from safety_helpers import private_copy, quantize_to

WEIGHTS = "model.safetensors"
MANIFEST = Path("tfcompile") / "manifest.json"


@pytest.fixture(scope="module")
def artifact_src(tiny_llama_src, tmp_path_factory):
    return quantize_to(tiny_llama_src, tmp_path_factory.mktemp("art") / "out")


@pytest.fixture
def artifact(artifact_src, tmp_path):
    return private_copy(artifact_src, tmp_path / "artifact")


def _manifest(art: Path) -> dict:
    return json.loads((art / MANIFEST).read_text())


def _write_raw_manifest(art: Path, obj) -> None:
    (art / MANIFEST).write_text(json.dumps(obj))


def _failed(res) -> dict[str, str]:
    return {c["check"]: c["detail"] for c in res.json()["checks"] if not c["ok"]}


def _verify_fails(run_cli, art, *needles):
    res = run_cli("verify", art)
    assert res.code == 1, res.err
    assert "Traceback" not in res.err and "internal error" not in res.err, res.err
    for n in needles:
        assert n in res.err, (n, res.err)
    return res


@pytest.mark.parametrize("how", ["truncated", "garbage", "empty", "header-only"])
def test_bad_shard_is_a_clear_failure(how, artifact, run_cli):
    f = artifact / WEIGHTS
    data = f.read_bytes()
    f.write_bytes({"truncated": data[: len(data) // 3], "garbage": b"\x00\xffnot safetensors" * 50,
                   "empty": b"", "header-only": data[:8]}[how])
    _verify_fails(run_cli, artifact, WEIGHTS)


@pytest.mark.parametrize("doc", [
    [],
    "just a string",
    {"schema_version": 1},
    {"schema_version": 1, "files": [], "layers": [], "scheme": {"name": "nvfp4a16"}},
    {"schema_version": 1, "files": {"a": 5}, "layers": [], "scheme": {"name": "nvfp4a16"}},
    {"schema_version": 1, "files": {}, "layers": "x", "scheme": {"name": "nvfp4a16"}},
    {"schema_version": 1, "files": {}, "layers": [{"module": 3, "shape": "big"}], "scheme": {"name": "nvfp4a16"}},
    {"schema_version": 1, "files": {}, "layers": [], "scheme": {"name": "int3"}},
    {"schema_version": 1, "files": {}, "layers": [], "scheme": "nvfp4"},
    {"schema_version": 1, "files": {}, "layers": [], "scheme": {"name": "nvfp4a16"}, "groups": [5]},
    {"schema_version": True},
])
def test_bad_manifest_is_a_clear_failure(doc, artifact, run_cli):
    _write_raw_manifest(artifact, doc)
    _verify_fails(run_cli, artifact, "manifest")
    res = run_cli("inspect", artifact)
    assert res.code == 1 and "Traceback" not in res.err and "manifest" in res.err, res.err


@pytest.mark.parametrize("entry", ["../../../../etc/passwd", "/etc/passwd", "tfcompile/../../outside.txt",
                                   "./config.json/../../x", "a\\..\\..\\b", ""])
def test_manifest_paths_must_stay_inside(entry, artifact, run_cli, monkeypatch):
    from tfcompile.artifact import tree

    (artifact.parent / "outside.txt").write_text("secret")
    read = []
    real = tree.sha256_file
    monkeypatch.setattr(tree, "sha256_file", lambda p: read.append(Path(p).resolve()) or real(p))
    doc = _manifest(artifact)
    doc["files"][entry] = "0" * 64
    from tfcompile.artifact.manifest import write_manifest

    write_manifest(artifact, doc)
    res = run_cli("verify", artifact, "--json")
    assert res.code == 1
    assert "outside the artifact" in _failed(res).get("paths", ""), _failed(res)
    root = artifact.resolve()
    assert all(p.is_relative_to(root) for p in read), read


def test_escaping_paths_leak_nothing_about_existence(artifact, run_cli):
    """The detail for an existing and a missing outside file is the same."""
    from tfcompile.artifact.manifest import write_manifest

    original, details = _manifest(artifact), []
    for target in ("/etc/passwd", "/no/such/file/anywhere"):
        write_manifest(artifact, {**original, "files": {**original["files"], target: "0" * 64}})
        details.append(_failed(run_cli("verify", artifact, "--json"))["paths"].replace(target, "X"))
    assert details[0] == details[1]


@pytest.mark.parametrize("extra", ["evil.py", "pytorch_model.bin", "model-extra.safetensors",
                                   "tfcompile/hook.py", "kernels/lib.so"])
def test_extra_files_are_reported(extra, artifact, run_cli):
    f = artifact / extra
    f.parent.mkdir(parents=True, exist_ok=True)
    f.write_bytes(b"print('pwned')\n")
    res = run_cli("verify", artifact, "--json")
    assert res.code == 1
    assert extra in _failed(res).get("extra files", ""), _failed(res)


def test_shard_replaced_by_symlink_out_of_the_artifact(artifact, run_cli, tmp_path):
    outside = tmp_path / "elsewhere.safetensors"
    shutil.copy(artifact / WEIGHTS, outside)  # same bytes: the checksum alone would pass
    (artifact / WEIGHTS).unlink()
    (artifact / WEIGHTS).symlink_to(outside)
    res = run_cli("verify", artifact, "--json")
    assert res.code == 1
    assert "symlink" in json.dumps(_failed(res)), _failed(res)


def test_symlinked_directory_is_reported(artifact, run_cli, tmp_path):
    (tmp_path / "d").mkdir()
    (artifact / "linked").symlink_to(tmp_path / "d")
    res = run_cli("verify", artifact, "--json")
    assert res.code == 1 and "linked" in json.dumps(_failed(res))


@pytest.mark.parametrize("edit", [
    lambda d: d["summary"].__setitem__("worst_sqnr_db", 99.0),
    lambda d: d["layers"][0].__setitem__("sqnr_db", 50.0),
    lambda d: d["recipe"].__setitem__("format", "fp8"),
    lambda d: d.__setitem__("ignore", []),
])
def test_manifest_edits_are_reported(edit, artifact, run_cli):
    doc = _manifest(artifact)
    edit(doc)
    (artifact / MANIFEST).write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")
    res = run_cli("verify", artifact, "--json")
    assert res.code == 1
    assert "manifest integrity" in _failed(res), _failed(res)


def test_untampered_artifact_passes_every_check(artifact, run_cli):
    res = run_cli("verify", artifact, "--json")
    assert res.code == 0, res.out
    names = {c["check"] for c in res.json()["checks"]}
    assert {"paths", "extra files", "manifest integrity", "checksums", "complete vs config"} <= names


def _tamper_weights(art: Path) -> None:
    f = art / WEIGHTS
    data = bytearray(f.read_bytes())
    data[-100] ^= 0xFF
    f.write_bytes(bytes(data))


def test_eval_checks_checksums_first(artifact, tiny_llama_src, run_cli):
    _tamper_weights(artifact)
    res = run_cli("eval", artifact, "--reference", tiny_llama_src, "--max-tokens", "64", "--seq-len", "32")
    assert res.code == 1 and "Traceback" not in res.err, res.err
    assert "checksums" in res.err and WEIGHTS in res.err and "--no-verify" in res.err


def test_eval_no_verify_skips_the_check(artifact, tiny_llama_src, run_cli):
    _tamper_weights(artifact)
    res = run_cli("eval", artifact, "--reference", tiny_llama_src, "--max-tokens", "64", "--seq-len", "32",
                  "--no-verify", "--json")
    assert res.code == 0, res.err


def test_eval_of_an_untampered_artifact_runs(artifact, tiny_llama_src, run_cli):
    res = run_cli("eval", artifact, "--reference", tiny_llama_src, "--max-tokens", "64", "--seq-len", "32",
                  "--json")
    assert res.code == 0, res.err


def test_self_digest_is_reproducible(artifact_src, tiny_llama_src, tmp_path, run_cli):
    out = tmp_path / "again"
    assert run_cli("quantize", tiny_llama_src, "-o", out, "--format", "nvfp4a16").code == 0
    assert (out / MANIFEST).read_bytes() == (artifact_src / MANIFEST).read_bytes()
    assert hashlib.sha256((out / WEIGHTS).read_bytes()).digest() == \
        hashlib.sha256((artifact_src / WEIGHTS).read_bytes()).digest()
