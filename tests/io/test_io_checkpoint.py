"""open_checkpoint: real HF checkpoints open; every bad directory is refused clearly."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from tfcompile.errors import CheckpointError
from tfcompile.io.checkpoint import open_checkpoint

INDEX = "model.safetensors.index.json"


def _expect(path, *fragments) -> CheckpointError:
    with pytest.raises(CheckpointError) as exc:
        open_checkpoint(path)
    err = exc.value
    assert err.hint
    for fragment in fragments:
        assert str(fragment) in err.message, (fragment, err.message)
    return err


def _write_index(model_dir: Path, weight_map: dict) -> Path:
    path = model_dir / INDEX
    path.write_text(json.dumps({"metadata": {"total_size": 0}, "weight_map": weight_map}))
    return path


def _to_sharded(model_dir: Path, extra_map: dict | None = None) -> Path:
    """Split model.safetensors into two shards plus an index; return the index path."""
    tensors = load_file(model_dir / "model.safetensors")
    (model_dir / "model.safetensors").unlink()
    names = sorted(tensors)
    halves = {"a.safetensors": names[: len(names) // 2], "b.safetensors": names[len(names) // 2 :]}
    weight_map = {}
    for file, part in halves.items():
        save_file({n: tensors[n] for n in part}, model_dir / file)
        weight_map.update({n: file for n in part})
    weight_map.update(extra_map or {})
    return _write_index(model_dir, weight_map)


# --- happy paths -------------------------------------------------------------


def test_opens_single_file_llama(tiny_llama):
    ref = load_file(tiny_llama / "model.safetensors")
    with open_checkpoint(tiny_llama) as ckpt:
        assert ckpt.path == tiny_llama
        assert ckpt.config["model_type"] == "llama"
        assert ckpt.files == [tiny_llama / "model.safetensors"]
        assert ckpt.names() == sorted(ref)
        for name in ckpt.names():
            assert torch.equal(ckpt.get(name), ref[name])
            assert ckpt.info(name).dtype == "BF16"
        assert ckpt.total_bytes == sum(t.numel() * t.element_size() for t in ref.values())
        assert ckpt.largest_tensor_bytes == max(t.numel() * t.element_size() for t in ref.values())
        assert [p.name for p in ckpt.aux_files()] == ["generation_config.json", "tokenizer.json", "tokenizer_config.json"]


def test_opens_sharded_checkpoint_from_save_pretrained(llama_sharded_dir):
    ckpt = open_checkpoint(llama_sharded_dir)
    index = json.loads((llama_sharded_dir / INDEX).read_text())
    assert len(ckpt.files) >= 3
    assert ckpt.files == sorted(ckpt.files)
    assert ckpt.names() == sorted(index["weight_map"])
    for name, file in index["weight_map"].items():
        assert ckpt.info(name).file.name == file
    assert ckpt.total_bytes == index["metadata"]["total_size"]


def test_get_is_memory_mapped_not_copied(tiny_llama):
    """The tensor's memory lies inside a mapping of the safetensors file."""
    ckpt = open_checkpoint(tiny_llama)
    t = ckpt.get("model.embed_tokens.weight")
    ptr = t.data_ptr()
    mapped = []
    with open("/proc/self/maps") as maps:
        for line in maps:
            fields = line.split()
            lo, hi = (int(x, 16) for x in fields[0].split("-"))
            if lo <= ptr < hi:
                mapped.append(fields[-1])
    assert mapped == [str((tiny_llama / "model.safetensors").resolve())]
    # one handle per file, reused
    ckpt.get("lm_head.weight")
    assert len(ckpt._maps) == 1


def test_auto_map_is_only_read(tiny_llama):
    cfg = json.loads((tiny_llama / "config.json").read_text())
    cfg["auto_map"] = {"AutoModelForCausalLM": "evil.Model"}
    (tiny_llama / "config.json").write_text(json.dumps(cfg))
    (tiny_llama / "evil.py").write_text("raise SystemExit('executed remote code')\n")
    assert open_checkpoint(tiny_llama).config["auto_map"]


def test_unknown_tensor_suggests_close_names(tiny_llama):
    with pytest.raises(CheckpointError) as exc:
        open_checkpoint(tiny_llama).info("lm_head.weights")
    assert "'lm_head.weights'" in exc.value.message and "lm_head.weight" in exc.value.hint


def test_glob_fallback_without_index(tiny_llama):
    index = _to_sharded(tiny_llama)
    index.unlink()
    ckpt = open_checkpoint(tiny_llama)
    assert [f.name for f in ckpt.files] == ["a.safetensors", "b.safetensors"]
    assert len(ckpt.names()) == 21


# --- config.json -------------------------------------------------------------


def test_missing_directory(tmp_path):
    _expect(tmp_path / "nope", tmp_path / "nope", "does not exist")


def test_path_is_a_file(tmp_path):
    (tmp_path / "f").write_text("x")
    _expect(tmp_path / "f", "not a directory")


def test_missing_config(tiny_llama):
    (tiny_llama / "config.json").unlink()
    _expect(tiny_llama, tiny_llama, "config.json")


@pytest.mark.parametrize(
    "text, fragment",
    [
        ("{not json", "invalid JSON"),
        ("[1, 2]", "expected a JSON object"),
        ('{"model_type": "llama"}', "'architectures'"),
        ('{"architectures": ["LlamaForCausalLM"]}', "'model_type'"),
        ('{"architectures": [], "model_type": "llama"}', "'architectures'"),
    ],
)
def test_bad_config(tiny_llama, text, fragment):
    (tiny_llama / "config.json").write_text(text)
    _expect(tiny_llama, tiny_llama / "config.json", fragment)


# --- weight discovery --------------------------------------------------------


@pytest.mark.parametrize("suffix", [".bin", ".pt", ".pth"])
def test_pickle_only_is_refused_without_loading(tiny_llama, suffix, monkeypatch):
    (tiny_llama / "model.safetensors").unlink()
    (tiny_llama / f"pytorch_model{suffix}").write_bytes(b"\x80\x04not really a pickle")

    def no_unpickling(*a, **k):
        raise AssertionError("torch.load must never be called")

    monkeypatch.setattr(torch, "load", no_unpickling)
    err = _expect(tiny_llama, f"pytorch_model{suffix}", "pickle")
    assert "safetensors" in err.hint


def test_no_weights_at_all(tiny_llama):
    (tiny_llama / "model.safetensors").unlink()
    _expect(tiny_llama, "no *.safetensors")


def test_corrupt_weight_file_names_file(tiny_llama):
    path = tiny_llama / "model.safetensors"
    path.write_bytes(path.read_bytes()[:-10])
    _expect(tiny_llama, path, "truncated")


def test_tensor_in_two_files(tiny_llama):
    save_file({"lm_head.weight": torch.zeros(2)}, tiny_llama / "extra.safetensors")
    (tiny_llama / "model.safetensors").rename(tiny_llama / "main.safetensors")
    _expect(tiny_llama, "'lm_head.weight'", "main.safetensors", "extra.safetensors")


# --- index.json --------------------------------------------------------------


def test_index_split_by_hand(tiny_llama):
    _to_sharded(tiny_llama)
    ckpt = open_checkpoint(tiny_llama)
    assert [f.name for f in ckpt.files] == ["a.safetensors", "b.safetensors"]


@pytest.mark.parametrize(
    "target, fragment",
    [
        ("../x.safetensors", "not a plain file name"),
        ("/etc/passwd", "not a plain file name"),
        ("sub/x.safetensors", "not a plain file name"),
        ("..", "not a plain file name"),
        ("", "not a plain file name"),
        (7, "not a plain file name"),
        ("missing.safetensors", "does not exist"),
    ],
)
def test_index_entry_rejected(tiny_llama, target, fragment):
    index = _to_sharded(tiny_llama, {"model.norm.weight": target})
    err = _expect(tiny_llama, index, "'model.norm.weight'", fragment)
    assert "passwd" not in err.hint


def test_index_entry_symlink_outside(tiny_llama, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    index = _to_sharded(tiny_llama)
    shutil.move(tiny_llama / "b.safetensors", outside / "b.safetensors")
    os.symlink(outside / "b.safetensors", tiny_llama / "b.safetensors")
    _expect(tiny_llama, index, "b.safetensors", "outside the model directory")


def test_index_entry_symlink_inside_is_allowed(tiny_llama):
    _to_sharded(tiny_llama)
    (tiny_llama / "blobs").mkdir()
    shutil.move(tiny_llama / "b.safetensors", tiny_llama / "blobs" / "b")
    os.symlink("blobs/b", tiny_llama / "b.safetensors")
    assert len(open_checkpoint(tiny_llama).names()) == 21


def test_index_names_tensor_missing_from_shard(tiny_llama):
    index = _to_sharded(tiny_llama)
    weight_map = json.loads(index.read_text())["weight_map"]
    weight_map["ghost.weight"] = "a.safetensors"
    _write_index(tiny_llama, weight_map)
    _expect(tiny_llama, index, "'ghost.weight'")


@pytest.mark.parametrize("content", ["{}", '{"weight_map": []}', "[]", "{bad"])
def test_bad_index(tiny_llama, content):
    (tiny_llama / "model.safetensors").rename(tiny_llama / "a.safetensors")
    (tiny_llama / INDEX).write_text(content)
    _expect(tiny_llama, tiny_llama / INDEX)


# --- symlinks on model.safetensors and aux files -----------------------------


def test_model_safetensors_symlink_outside(tiny_llama, tmp_path):
    (tmp_path / "elsewhere").mkdir()
    target = tmp_path / "elsewhere" / "w.safetensors"
    shutil.move(tiny_llama / "model.safetensors", target)
    os.symlink(target, tiny_llama / "model.safetensors")
    _expect(tiny_llama, "model.safetensors", "outside the model directory")


def test_dangling_symlink(tiny_llama):
    (tiny_llama / "model.safetensors").unlink()
    os.symlink(tiny_llama / "gone", tiny_llama / "model.safetensors")
    _expect(tiny_llama, "model.safetensors", "broken symlink")


def test_hf_cache_snapshot_symlinks_allowed(tiny_llama, tmp_path):
    """<repo>/snapshots/<rev>/file -> ../../blobs/<hash> is how the HF cache stores files."""
    repo = tmp_path / "hub" / "models--org--tiny"
    snap = repo / "snapshots" / "0123abc"
    (repo / "blobs").mkdir(parents=True)
    snap.mkdir(parents=True)
    for f in sorted(tiny_llama.iterdir()):
        shutil.copy(f, repo / "blobs" / f"h-{f.name}")
        os.symlink(f"../../blobs/h-{f.name}", snap / f.name)
    ckpt = open_checkpoint(snap)
    assert len(ckpt.names()) == 21 and len(ckpt.aux_files()) == 3
    ckpt.get("lm_head.weight")
    # but not a link out of the repo cache
    os.unlink(snap / "tokenizer.json")
    os.symlink(tiny_llama / "tokenizer.json", snap / "tokenizer.json")
    with pytest.raises(CheckpointError, match="outside the model directory"):
        ckpt.aux_files()


def test_aux_symlink_escaping_is_refused(tiny_llama, tmp_path):
    (tiny_llama / "tokenizer.json").unlink()
    os.symlink("/etc/hostname", tiny_llama / "tokenizer.json")
    with pytest.raises(CheckpointError) as exc:
        open_checkpoint(tiny_llama).aux_files()
    assert "tokenizer.json" in exc.value.message and exc.value.hint


def test_aux_files_skip_absent_and_list_present(tiny_llama):
    (tiny_llama / "chat_template.jinja").write_text("{{ messages }}")
    (tiny_llama / "generation_config.json").unlink()
    names = [p.name for p in open_checkpoint(tiny_llama).aux_files()]
    assert names == ["chat_template.jinja", "tokenizer.json", "tokenizer_config.json"]


# --- dtype policy ------------------------------------------------------------


def test_require_float(tmp_path, tiny_llama):
    tensors = load_file(tiny_llama / "model.safetensors")
    tensors["q.weight"] = torch.zeros(4, 4, dtype=torch.float8_e4m3fn)
    tensors["idx"] = torch.zeros(4, dtype=torch.int64)
    save_file(tensors, tiny_llama / "model.safetensors")
    ckpt = open_checkpoint(tiny_llama)
    assert ckpt.require_float("lm_head.weight").dtype == "BF16"
    with pytest.raises(CheckpointError) as exc:
        ckpt.require_float("q.weight")
    assert "'q.weight'" in exc.value.message and "F8_E4M3" in exc.value.message
    assert "already quantized" in exc.value.hint
    with pytest.raises(CheckpointError, match="'idx' is I64"):
        ckpt.require_float("idx")


def _mapped_rss_kb(path: Path) -> int:
    """Resident KiB of this process's mappings of `path` (Linux /proc/self/smaps)."""
    total, inside = 0, False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()
        if len(head) >= 5 and "-" in head[0] and not head[0].endswith(":"):
            inside = line.endswith(str(path))
        elif inside and line.startswith("Rss:"):
            total += int(head[1])
    return total


@pytest.mark.skipif(not Path("/proc/self/smaps").exists(), reason="needs Linux /proc")
def test_release_drops_touched_pages_and_data_stays_readable(tmp_path):
    a = torch.arange(4 << 20, dtype=torch.float32).reshape(1024, -1)  # 16 MiB
    b = torch.ones(3, 5, dtype=torch.bfloat16)
    save_file({"a": a, "b": b}, tmp_path / "model.safetensors")
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "model_type": "llama"}))
    file = (tmp_path / "model.safetensors").resolve()
    with open_checkpoint(tmp_path) as ckpt:
        got = ckpt.get("a")
        assert float(got.sum()) == float(a.sum())  # touches every page
        assert _mapped_rss_kb(file) >= 16 << 10
        ckpt.release()
        assert _mapped_rss_kb(file) < 1 << 10  # the touched range left the resident set
        assert torch.equal(got, a)  # still readable: pages fault back in from the page cache
        assert torch.equal(ckpt.get("b"), b)
        ckpt.release()
    ckpt.release()  # after close: nothing to drop, no error


@pytest.mark.skipif(not Path("/proc/self/smaps").exists(), reason="needs Linux /proc")
def test_hand_off_drops_the_pages_when_called_and_release_skips_them(tmp_path):
    """pack hands a copied tensor's ranges to the writer thread: they stay resident until it calls
    the function (after writing them), and a release() in between leaves them alone."""
    a = torch.arange(4 << 20, dtype=torch.float32).reshape(1024, -1)  # 16 MiB
    save_file({"a": a}, tmp_path / "model.safetensors")
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "model_type": "llama"}))
    file = (tmp_path / "model.safetensors").resolve()
    with open_checkpoint(tmp_path) as ckpt:
        got = ckpt.get("a")
        assert float(got.sum()) == float(a.sum())  # touches every page
        drop = ckpt.hand_off()
        ckpt.release()  # nothing handed out since the hand-off
        assert _mapped_rss_kb(file) >= 16 << 10
        drop()
        assert _mapped_rss_kb(file) < 1 << 10
        assert torch.equal(got, a)
        ckpt.get("a").sum()
        late = ckpt.hand_off()
    late()  # after close: nothing to drop, no error
