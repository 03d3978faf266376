"""MODEL as a Hugging Face Hub id, resolved offline from a Hub-layout cache built here.

The cache is what huggingface_hub writes (models--ORG--NAME/{blobs,refs,snapshots}): blobs named
by content, refs/main holding the commit sha, snapshots/<sha>/<file> symlinks to ../../blobs/.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from fixtures import hub as hub_fixture
from tests_helpers import tensors

REPO = "tfcompile-test/tiny-llama"
COMMIT = "0123456789abcdef0123456789abcdef01234567"
TOKEN = "hf_tfcompileTestTokenNeverLogged0123456789"


def make_hub_cache(cache: Path, src: Path, repo: str = REPO, commit: str = COMMIT,
                   refs: tuple[str, ...] = ("main",)) -> Path:
    """A Hub cache holding `src`'s files as revision `commit` of `repo`; returns the snapshot dir."""
    return hub_fixture.make_hub_cache(cache, src, repo, commit, refs)


@pytest.fixture
def hub(tiny_llama_src, tmp_path, monkeypatch):
    """HF_HUB_CACHE with the tiny Llama as REPO@COMMIT (main), offline, a token in the environment."""
    cache = tmp_path / "hub"
    snap = make_hub_cache(cache, tiny_llama_src)
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    return snap


def _all_text(out: Path, *streams: str) -> str:
    files = [p.read_bytes().decode("latin-1") for p in out.rglob("*") if p.is_file()]
    return "\n".join([*streams, *files])


def test_quantize_a_hub_id_from_the_cache_records_repo_and_commit(hub, tiny_llama_src, tmp_path, run_cli):
    out = tmp_path / "out"
    res = run_cli("quantize", REPO, "-o", out, "--format", "nvfp4a16", "--json")
    assert res.code == 0, res.err
    source = json.loads((out / "tfcompile" / "manifest.json").read_text())["source"]
    assert source["name"] == REPO and source["hub"] == {"repo_id": REPO, "commit": COMMIT}
    assert TOKEN not in _all_text(out, res.out, res.err)  # the token is huggingface_hub's, never ours
    # the same bytes as quantizing the files directly: only the manifest's source entry differs
    local = tmp_path / "local"
    assert run_cli("quantize", tiny_llama_src, "-o", local, "--format", "nvfp4a16").code == 0
    assert (out / "model.safetensors").read_bytes() == (local / "model.safetensors").read_bytes()
    assert "hub" not in json.loads((local / "tfcompile" / "manifest.json").read_text())["source"]
    assert run_cli("verify", out).code == 0


def test_revision_by_commit_and_by_tag(hub, tiny_llama_src, tmp_path, run_cli):
    other = "fedcba9876543210fedcba9876543210fedcba98"
    make_hub_cache(Path(os.environ["HF_HUB_CACHE"]), tiny_llama_src, commit=other, refs=("v2",))
    for rev, commit in ((COMMIT, COMMIT), ("v2", other), ("main", COMMIT)):
        out = tmp_path / f"out-{rev}"
        res = run_cli("quantize", REPO, "--revision", rev, "-o", out, "--format", "mxfp8", "-q")
        assert res.code == 0, res.err
        assert json.loads((out / "tfcompile/manifest.json").read_text())["source"]["hub"]["commit"] == commit


def test_hf_home_locates_the_cache(tiny_llama_src, tmp_path, monkeypatch, run_cli):
    make_hub_cache(tmp_path / "hf-home" / "hub", tiny_llama_src)
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    res = run_cli("quantize", REPO, "-o", tmp_path / "out", "--format", "fp8-dynamic", "-q")
    assert res.code == 0, res.err


def test_hub_errors_name_the_repo_and_say_what_to_do(hub, tmp_path, run_cli):
    res = run_cli("quantize", REPO, "--revision", "v9", "-o", tmp_path / "a", "--format", "mxfp8")
    assert res.code == 1 and f"MODEL {REPO} is not a local directory" in res.err
    assert "'v9'" in res.err and "HF_HUB_OFFLINE" in res.err and "hint: download it once" in res.err
    res = run_cli("quantize", "nobody/nothing", "-o", tmp_path / "b", "--format", "mxfp8")
    assert res.code == 1 and "hint:" in res.err
    res = run_cli("quantize", "no/such/dir", "-o", tmp_path / "c", "--format", "mxfp8")  # not an id: a path
    assert res.code == 1 and "no/such/dir" in res.err
    res = run_cli("quantize", hub, "--revision", "main", "-o", tmp_path / "d", "--format", "mxfp8")
    assert res.code == 1 and "is not a Hugging Face Hub id" in res.err
    assert not any(p.name in "abcd" for p in tmp_path.iterdir())  # nothing written
    assert TOKEN not in res.err


def test_a_snapshot_directory_given_as_a_path_keeps_its_provenance(hub, tmp_path, run_cli):
    res = run_cli("quantize", hub, "-o", tmp_path / "out", "--format", "nvfp4a16", "-q")
    assert res.code == 0, res.err
    assert json.loads((tmp_path / "out/tfcompile/manifest.json").read_text())["source"]["hub"]["commit"] == COMMIT
    assert tensors(tmp_path / "out")  # weights read through the snapshot's symlinks into blobs/


def test_eval_reference_as_a_hub_id(hub, tiny_llama_src, tmp_path, run_cli):
    out = tmp_path / "out"
    assert run_cli("quantize", REPO, "-o", out, "--format", "fp8-dynamic", "-q").code == 0
    text = tmp_path / "t.txt"
    text.write_text("the quick brown fox jumps over the lazy dog. " * 40)
    res = run_cli("eval", out, "--reference", REPO, "--text", text, "--max-tokens", "128", "--json")
    assert res.code == 0, res.err
    assert res.json()["metrics"]["kl_mean"] >= 0
