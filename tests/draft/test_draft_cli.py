"""`tfcompile draft` and `tfcompile eval --draft` end to end on the demo LM.

CI's acceptance check: a tiny draft trained in seconds beats the n-gram (prompt lookup) floor
on python-doc's held-out text; `--min-acceptance` exits 1 on a miss. The written directory is
byte-identical across runs and after an interrupted, resumed run.
"""

from __future__ import annotations

import json
from pathlib import Path

# not `from conftest import DEMO`: under xdist another folder's conftest may own that name
DEMO = Path(__file__).resolve().parents[2] / "examples" / "demo-lm"

SMALL = ["--steps", "6", "--batch", "2", "--seq-len", "32", "--text-blocks", "8", "--self-blocks", "4",
         "--self-prompt", "8", "--checkpoint-every", "2"]
EVAL = ["--reference", DEMO, "--max-tokens", "512", "--no-layers", "--draft-k", "2,3", "--draft-prompts", "8",
        "--draft-prompt-len", "32", "--draft-new-tokens", "32", "--json"]


def _files(d):
    return {p.relative_to(d).as_posix(): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


def test_tiny_draft_beats_the_ngram_floor_and_the_gate_fails_above_it(tiny_draft, run_cli):
    res = run_cli("eval", DEMO, *EVAL, "--draft", tiny_draft, "--min-acceptance", "10")
    assert res.code == 1, res.err
    assert "--min-acceptance" in res.err and "hint:" in res.err
    doc = res.json()
    rep = doc["draft"]
    assert rep["drafter"] == "eagle3" and rep["text"].endswith(":heldout")
    floor = {r["k"]: r["acceptance_length"] for r in rep["ngram_floor"]}
    for r in rep["by_k"]:
        assert r["acceptance_length"] > floor[r["k"]], (r, floor)
        assert r["per_position"][0] > 0.2
    assert doc["gates"][-1]["gate"] == "min-acceptance" and not doc["ok"]


def test_min_acceptance_passes_below_the_figure(run_cli):
    res = run_cli("eval", DEMO, *EVAL, "--draft", "ngram", "--min-acceptance", "1.0", "--draft-prompts", "2")
    assert res.code == 0, res.err
    assert res.json()["gates"][-1]["ok"]


def test_min_acceptance_needs_a_draft(run_cli):
    res = run_cli("eval", DEMO, "--reference", DEMO, "--min-acceptance", "2")
    assert res.code == 2 and "--draft" in res.err


def test_the_record_and_the_json(tiny_draft):
    rec = json.loads((tiny_draft / "tfcompile" / "draft.json").read_text())
    assert rec["target"]["served_as"] == "checkpoint" and rec["method"] == "eagle3"
    assert rec["data"]["self_sequences"] == 32 and rec["data"]["source"] == "python-doc:train"
    assert rec["draft"]["aux_layers"] == [1, 2, 3] and rec["draft"]["bytes"] > 0
    assert set(rec["files"]) == {"config.json", "model.safetensors"}


def test_a_killed_run_resumes_to_the_bytes_of_an_uninterrupted_one(tmp_path, run_cli, monkeypatch):
    from tfcompile.distill import train

    res = run_cli("draft", DEMO, "-o", tmp_path / "a", *SMALL, "--json", "-q")
    assert res.code == 0, res.err
    assert res.json()["ok"] and res.json()["training"]["steps"] == 6
    resume = tmp_path / "resume"

    def after_step(self, step):
        if step == 5:
            raise RuntimeError("killed")  # dies between checkpoints (saved at 2 and 4)

    monkeypatch.setattr(train.Loop, "after_step", after_step)
    res = run_cli("draft", DEMO, "-o", tmp_path / "b", *SMALL, "--resume-dir", resume, "-q")
    assert res.code == 2 and not (tmp_path / "b").exists()
    monkeypatch.undo()
    res = run_cli("draft", DEMO, "-o", tmp_path / "b", *SMALL, "--resume-dir", resume, "--json", "-q")
    assert res.code == 0, res.err
    assert res.json()["timings"]["resumed_at"] == 4
    assert _files(tmp_path / "b") == _files(tmp_path / "a")


def test_errors_are_user_errors_with_a_hint(tmp_path, run_cli):
    res = run_cli("draft", DEMO, "-o", tmp_path / "x", "--target-artifact", DEMO, "--steps", "1")
    assert res.code == 1 and "not a tfcompile artifact" in res.err and "hint:" in res.err
    assert not (tmp_path / "x").exists()
    res = run_cli("eval", DEMO, "--reference", DEMO, "--draft", tmp_path, "--max-tokens", "64", "--no-layers")
    assert res.code == 1 and "hint:" in res.err


def test_an_existing_out_is_refused_before_any_training(tmp_path, run_cli):
    (tmp_path / "x").mkdir()
    res = run_cli("draft", DEMO, "-o", tmp_path / "x", "--steps", "1")
    assert res.code == 1 and "already exists" in res.err and "--overwrite" in res.err
    assert "distill draft" not in res.err  # refused up front: no training step ran


def test_a_run_killed_in_self_generation_keeps_the_decoded_chunks(tmp_path, run_cli, monkeypatch):
    """Self-generation is saved chunk by chunk (tfcompile/draft/train.py SelfGenerated): a kill after
    the first chunk resumes there, decodes only the rest and writes the uninterrupted run's bytes; a
    chunk that does not continue this run's prompts is refused, naming the file."""
    from tfcompile.draft import train

    monkeypatch.setattr(train, "GEN_BATCH", 2)  # 4 self-generated sequences: 2 chunks
    res = run_cli("draft", DEMO, "-o", tmp_path / "a", *SMALL, "-q")
    assert res.code == 0, res.err
    resume, saved = tmp_path / "resume", train.SelfGenerated.save

    def save_then_die(self, c, ids):
        saved(self, c, ids)
        if c == 0:
            raise RuntimeError("killed")  # dies after chunk 0 is on disk

    monkeypatch.setattr(train.SelfGenerated, "save", save_then_die)
    assert run_cli("draft", DEMO, "-o", tmp_path / "b", *SMALL, "--resume-dir", resume, "-q").code == 2
    assert sorted(p.name for p in resume.glob("selfgen-*")) == ["selfgen-00000.safetensors"]
    monkeypatch.setattr(train.SelfGenerated, "save", saved)
    loaded, load = [], train.SelfGenerated.load
    monkeypatch.setattr(train.SelfGenerated, "load",
                        lambda self, c, p, t: loaded.append((c, r := load(self, c, p, t))) or r)
    assert run_cli("draft", DEMO, "-o", tmp_path / "b", *SMALL, "--resume-dir", resume, "-q").code == 0
    assert [(c, r is not None) for c, r in loaded] == [(0, True), (1, False)]  # chunk 0 read, chunk 1 decoded
    assert _files(tmp_path / "b") == _files(tmp_path / "a")
    # a chunk of other prompts (here: chunk 1's file in chunk 0's place) is refused with a hint
    (resume / "selfgen-00000.safetensors").write_bytes((resume / "selfgen-00001.safetensors").read_bytes())
    res = run_cli("draft", DEMO, "-o", tmp_path / "c", *SMALL, "--resume-dir", resume, "-q")
    assert res.code == 1 and "selfgen-00000.safetensors" in res.err and "hint:" in res.err


def test_a_cache_on_disk_writes_the_same_draft_and_survives_a_kill(tmp_path, run_cli, monkeypatch):
    """--cache disk (tfcompile/draft/cache.py): the same bytes as the in-memory cache; a run killed in
    training resumes without a target forward for the chunks on disk; a damaged chunk is named."""
    from tfcompile.distill import train
    from tfcompile.draft import cache

    assert run_cli("draft", DEMO, "-o", tmp_path / "a", *SMALL, "-q").code == 0
    resume = tmp_path / "resume"

    def after_step(self, step):
        if step == 3:
            raise RuntimeError("killed")

    monkeypatch.setattr(train.Loop, "after_step", after_step)
    disk = ["--cache", "disk", "--resume-dir", resume, "-q"]
    assert run_cli("draft", DEMO, "-o", tmp_path / "b", *SMALL, *disk).code == 2
    assert sorted(p.name for p in resume.glob("tcache-*")) == ["tcache-00000.safetensors", "tcache-00001.safetensors"]
    monkeypatch.undo()
    put = []
    monkeypatch.setattr(cache._Disk, "put", lambda self, c, v: put.append(c))
    assert run_cli("draft", DEMO, "-o", tmp_path / "b", *SMALL, *disk).code == 0
    assert put == []  # 12 sequences = 2 chunks, both read back
    assert _files(tmp_path / "b") == _files(tmp_path / "a")
    (resume / "tcache-00001.safetensors").write_bytes(b"\0" * 64)
    res = run_cli("draft", DEMO, "-o", tmp_path / "c", *SMALL, *disk)
    assert res.code == 1 and "tcache-00001.safetensors" in res.err and "hint:" in res.err


def test_cache_options_are_checked_and_recorded(tmp_path, run_cli):
    res = run_cli("draft", DEMO, "-o", tmp_path / "x", *SMALL, "--cache", "disk")
    assert res.code == 1 and "--resume-dir" in res.err and "hint:" in res.err and not (tmp_path / "x").exists()
    res = run_cli("draft", DEMO, "-o", tmp_path / "y", *SMALL, "--cache-dtype", "bfloat16", "--json", "-q")
    assert res.code == 0, res.err
    assert res.json()["config"]["cache_dtype"] == "bfloat16"
    rec = json.loads((tmp_path / "y" / "tfcompile" / "draft.json").read_text())
    assert rec["config"]["cache_dtype"] == "bfloat16"


def test_a_float32_cache_is_left_out_of_the_record(tiny_draft):
    """Records and resume folders from before --cache-dtype keep their bytes."""
    rec = json.loads((tiny_draft / "tfcompile" / "draft.json").read_text())
    assert "cache_dtype" not in rec["config"] and "cache" not in rec["config"]


def test_compute_dtype_is_checked_recorded_and_auto_follows_the_cpu(tmp_path, run_cli, monkeypatch):
    """--compute-dtype: bfloat16 is recorded (it changes the cache's bits), float32 left out, a bad value
    refused with a hint; auto resolves from the checkpoint's dtype (the demo LM is BF16) and this CPU
    (tfcompile.machine: bf16 where it is native, float32 where it is emulated) before it is recorded."""
    from tfcompile import machine
    from tfcompile.draft.format import WEIGHTS

    res = run_cli("draft", DEMO, "-o", tmp_path / "bad", *SMALL, "--compute-dtype", "fp8")
    assert res.code == 2 and "--compute-dtype" in res.err and not (tmp_path / "bad").exists()
    res = run_cli("draft", DEMO, "-o", tmp_path / "bf", *SMALL, "--compute-dtype", "bfloat16", "--json", "-q")
    assert res.code == 0, res.err
    rec = json.loads((tmp_path / "bf" / "tfcompile" / "draft.json").read_text())
    assert rec["config"]["compute_dtype"] == "bfloat16" == res.json()["timings"]["compute_dtype"]
    f32 = run_cli("draft", DEMO, "-o", tmp_path / "f32", *SMALL, "--json", "-q")
    assert f32.code == 0 and "compute_dtype" not in f32.json()["config"]
    weights = [(tmp_path / d / WEIGHTS).read_bytes() for d in ("f32", "bf")]
    assert weights[0] != weights[1]  # the target's forwards (its cache) really changed dtype
    for native, want in ((False, "float32"), (True, "bfloat16")):
        monkeypatch.setattr(machine, "native_bf16", lambda native=native: native)
        monkeypatch.setattr(machine, "onednn_cap", lambda: "")
        out = tmp_path / f"auto-{want}"
        res = run_cli("draft", DEMO, "-o", out, *SMALL, "--compute-dtype", "auto", "--json", "-q")
        assert res.code == 0, res.err
        assert res.json()["timings"]["compute_dtype"] == want
        assert _files(out) == _files(tmp_path / ("bf" if want == "bfloat16" else "f32"))
