"""ShardWriter / plan_shards: the real safetensors library reads our files bit-exactly."""

from __future__ import annotations

import errno
import hashlib
import json
import os

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors import safe_open
from safetensors.torch import load_file

from tfcompile.errors import UserError
from tfcompile.io import writer as writer_mod
from tfcompile.io.checkpoint import open_checkpoint
from tfcompile.io.safetensors_header import read_header
from tfcompile.io.writer import ShardWriter, TensorSpec, encode_header, plan_shards, write_index

ALL_DTYPES = [
    torch.bool,
    torch.uint8,
    torch.int8,
    torch.int16,
    torch.int32,
    torch.int64,
    torch.float16,
    torch.bfloat16,
    torch.float32,
    torch.float64,
    torch.float8_e4m3fn,
    torch.float8_e5m2,
]


def _random(dtype: torch.dtype, shape: tuple[int, ...], seed: int) -> torch.Tensor:
    """Random bytes of any dtype (so every bit pattern, NaN codes included, is exercised)."""
    g = torch.Generator().manual_seed(seed)
    n = int(torch.Size(shape).numel()) * dtype.itemsize
    raw = torch.randint(0, 256, (n,), dtype=torch.uint8, generator=g)
    if dtype == torch.bool:
        raw = raw % 2
    return raw.view(dtype).reshape(shape)


def _write(path, tensors: dict, metadata=None) -> writer_mod.ShardResult:
    specs = [TensorSpec(n, t.dtype, tuple(t.shape)) for n, t in tensors.items()]
    (plan,) = plan_shards(specs, max_shard_bytes=1 << 40)
    w = ShardWriter(path, plan, metadata)
    for name, t in tensors.items():
        w.write(name, t)
    return w.close()


def _bits_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    raw = lambda t: t.reshape(-1).view(torch.uint8)  # noqa: E731  (bytes: NaN == NaN here)
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(raw(a), raw(b))


def test_every_dtype_round_trips_bit_exactly(tmp_path):
    shapes = [(), (1,), (3, 5), (0, 4), (2, 3, 4)]
    tensors = {
        f"{str(d).removeprefix('torch.')}_{i}": _random(d, s, seed=i) for d in ALL_DTYPES for i, s in enumerate(shapes)
    }
    path = tmp_path / "all.safetensors"
    _write(path, tensors, {"format": "pt", "producer": "tfcompile"})
    loaded = load_file(path)
    assert set(loaded) == set(tensors)
    for name, t in tensors.items():
        assert _bits_equal(loaded[name], t), name
    with safe_open(str(path), framework="pt") as f:
        assert f.metadata() == {"format": "pt", "producer": "tfcompile"}
        assert _bits_equal(f.get_tensor("float8_e4m3fn_2"), tensors["float8_e4m3fn_2"])
    assert read_header(path).tensors["float8_e4m3fn_0"].dtype == "F8_E4M3"
    assert read_header(path).tensors["float8_e5m2_1"].dtype == "F8_E5M2"


def test_close_reports_sha256_and_size(tmp_path):
    path = tmp_path / "x.safetensors"
    result = _write(path, {"x": torch.arange(10, dtype=torch.int32)})
    data = path.read_bytes()
    assert result.sha256 == hashlib.sha256(data).hexdigest()
    assert result.size == len(data) and result.path == path


def test_header_layout_matches_safetensors_conventions(tmp_path):
    (plan,) = plan_shards([TensorSpec("b", torch.float32, (3,)), TensorSpec("a", torch.uint8, (5,))], 1000)
    raw = encode_header(plan, {"z": "1", "a": "2"})
    n = int.from_bytes(raw[:8], "little")
    assert n == len(raw) - 8 and n % 8 == 0
    text = raw[8:].decode()
    assert text.startswith('{"__metadata__":{"a":"2","z":"1"},"a":')  # metadata first, then names sorted
    assert text == text.rstrip() + " " * (len(text) - len(text.rstrip()))
    header = json.loads(text)
    assert header["b"]["data_offsets"] == [0, 12] and header["a"]["data_offsets"] == [12, 17]  # plan order


def test_writing_twice_gives_identical_bytes(tmp_path):
    tensors = {"w": _random(torch.bfloat16, (64, 32), 1), "s": _random(torch.float8_e4m3fn, (64, 1), 2)}
    _write(tmp_path / "1.safetensors", tensors, {"b": "1", "a": "2"})
    _write(tmp_path / "2.safetensors", tensors, {"a": "2", "b": "1"})  # dict order does not matter
    assert (tmp_path / "1.safetensors").read_bytes() == (tmp_path / "2.safetensors").read_bytes()


def test_non_contiguous_input(tmp_path):
    t = torch.arange(12, dtype=torch.float32).reshape(3, 4).t()
    _write(tmp_path / "t.safetensors", {"t": t})
    assert torch.equal(load_file(tmp_path / "t.safetensors")["t"], t)


@settings(max_examples=25, deadline=None)
@given(
    shapes=st.lists(st.lists(st.integers(0, 5), min_size=0, max_size=3), min_size=1, max_size=6),
    dtype_idx=st.lists(st.integers(0, len(ALL_DTYPES) - 1), min_size=6, max_size=6),
    limit=st.integers(1, 200),
)
def test_sharded_write_reads_back_as_checkpoint(tmp_path_factory, shapes, dtype_idx, limit):
    out = tmp_path_factory.mktemp("sharded")
    tensors = {f"t{i}": _random(ALL_DTYPES[dtype_idx[i]], tuple(s), i) for i, s in enumerate(shapes)}
    plans = plan_shards([TensorSpec(n, t.dtype, t.shape) for n, t in tensors.items()], limit)
    for plan in plans:
        assert plan.nbytes <= limit or len(plan.specs) == 1
        with ShardWriter(out / plan.file_name, plan) as w:
            for spec in plan.specs:
                w.write(spec.name, tensors[spec.name])
    write_index(out, plans)
    (out / "config.json").write_text('{"architectures": ["X"], "model_type": "x"}')
    ckpt = open_checkpoint(out)
    assert ckpt.names() == sorted(tensors)
    for name, t in tensors.items():
        assert _bits_equal(ckpt.get(name), t), name


def test_plan_shards_names_and_order():
    specs = [TensorSpec(f"t{i}", torch.float32, (10,)) for i in range(5)]  # 40 bytes each
    plans = plan_shards(specs, 100)
    assert [p.file_name for p in plans] == [f"model-0000{i}-of-00003.safetensors" for i in (1, 2, 3)]
    assert [[s.name for s in p.specs] for p in plans] == [["t0", "t1"], ["t2", "t3"], ["t4"]]
    assert [p.file_name for p in plan_shards(specs, 1000)] == ["model.safetensors"]
    big = plan_shards([TensorSpec("big", torch.float32, (100,)), *specs[:1]], 100)
    assert [[s.name for s in p.specs] for p in big] == [["big"], ["t0"]]  # oversize tensor alone


def test_write_index(tmp_path):
    specs = [TensorSpec(n, torch.float16, (4,)) for n in ("z", "a", "m")]
    plans = plan_shards(specs, 8)
    path = write_index(tmp_path, plans)
    index = json.loads(path.read_text())
    assert index["metadata"]["total_size"] == 24
    assert list(index["weight_map"]) == ["a", "m", "z"]
    assert index["weight_map"]["z"] == "model-00001-of-00003.safetensors"
    assert write_index(tmp_path / "none", plan_shards(specs, 1000)) is None


def test_plan_errors():
    with pytest.raises(UserError):
        plan_shards([], 0)
    with pytest.raises(ValueError, match="'a' is planned twice"):
        plan_shards([TensorSpec("a", torch.float32, (1,))] * 2, 100)
    with pytest.raises(ValueError, match="cannot be written"):
        TensorSpec("c", torch.complex64, (1,))


def test_write_misuse(tmp_path):
    specs = [TensorSpec("a", torch.float32, (2,)), TensorSpec("b", torch.uint8, (3,))]
    (plan,) = plan_shards(specs, 100)
    w = ShardWriter(tmp_path / "x.safetensors", plan)
    with pytest.raises(ValueError, match="expected tensor 'a' next, got 'b'"):
        w.write("b", torch.zeros(3, dtype=torch.uint8))
    with pytest.raises(ValueError, match="planned torch.float32"):
        w.write("a", torch.zeros(2, dtype=torch.float16))
    with pytest.raises(ValueError, match=r"\(3,\)"):
        w.write("a", torch.zeros(3))
    w.write("a", torch.zeros(2))
    with pytest.raises(ValueError, match="before writing 1 tensors, first 'b'"):
        w.close()


def test_write_after_last_tensor(tmp_path):
    (plan,) = plan_shards([TensorSpec("a", torch.uint8, (1,))], 100)
    w = ShardWriter(tmp_path / "x.safetensors", plan)
    w.write("a", torch.zeros(1, dtype=torch.uint8))
    with pytest.raises(ValueError, match="not planned"):
        w.write("extra", torch.zeros(1, dtype=torch.uint8))
    w.close()
    assert load_file(tmp_path / "x.safetensors")["a"].tolist() == [0]


class _FailingFile:
    """A file object whose writes fail with `err` once `budget` bytes were written."""

    def __init__(self, real, budget: int, err: int):
        self.real, self.budget, self.err = real, budget, err

    def write(self, data):
        n = memoryview(data).nbytes
        if n > self.budget:
            raise OSError(self.err, os.strerror(self.err))
        self.budget -= n
        return self.real.write(data)

    def __getattr__(self, name):
        return getattr(self.real, name)


@pytest.mark.parametrize("err, hint", [(errno.ENOSPC, "disk is full"), (errno.EACCES, "permission")])
def test_write_errors_become_user_errors(tmp_path, monkeypatch, err, hint):
    real_open = writer_mod.OutputFile
    monkeypatch.setattr(writer_mod, "OutputFile", lambda p, **kw: _FailingFile(real_open(p, **kw), 100, err))
    (plan,) = plan_shards([TensorSpec("w", torch.float32, (64,))], 1000)
    path = tmp_path / "x.safetensors"
    w = ShardWriter(path, plan)
    with pytest.raises(UserError) as exc:
        w.write("w", torch.zeros(64))
    assert str(path) in exc.value.message and hint in exc.value.hint


def test_create_error_names_file(tmp_path, monkeypatch):
    def denied(p, **kw):
        raise PermissionError(errno.EACCES, "Permission denied", str(p))

    monkeypatch.setattr(writer_mod, "OutputFile", denied)
    (plan,) = plan_shards([], 1)
    with pytest.raises(UserError) as exc:
        ShardWriter(tmp_path / "x.safetensors", plan)
    assert "x.safetensors" in exc.value.message and "permission" in exc.value.hint


def test_tiny_llama_rewritten_through_writer_round_trips(tiny_llama, tmp_path):
    ckpt = open_checkpoint(tiny_llama)
    specs = [TensorSpec(n, ckpt.get(n).dtype, ckpt.info(n).shape) for n in ckpt.names()]
    plans = plan_shards(specs, 200_000)
    assert len(plans) > 1
    for plan in plans:
        with ShardWriter(tmp_path / plan.file_name, plan, {"format": "pt"}) as w:
            for s in plan.specs:
                w.write(s.name, ckpt.get(s.name))
    write_index(tmp_path, plans)
    merged = {}
    for plan in plans:
        merged.update(load_file(tmp_path / plan.file_name))
    ref = load_file(tiny_llama / "model.safetensors")
    assert merged.keys() == ref.keys() and all(_bits_equal(merged[k], ref[k]) for k in ref)


def test_dtype_tables_agree():
    from tfcompile.io.dtypes import BITS, code_of, torch_dtype_of

    for dtype in ALL_DTYPES:
        code = code_of(dtype)
        assert torch_dtype_of(code) == dtype
        assert BITS[code] == dtype.itemsize * 8
    with pytest.raises(ValueError, match="'F4'"):
        torch_dtype_of("F4")


def test_sink_after_runs_once_everything_before_it_is_written(tmp_path):
    """ShardSink.after(fn): fn runs on the writer thread after the tensors queued before it are
    written (pack drops a copied tensor's source pages then) and before those queued after it."""
    from tfcompile.artifact.sink import ShardSink

    specs = [TensorSpec(f"t{i}", torch.float32, (256, 256)) for i in range(3)]
    sink = ShardSink(tmp_path, specs, 1 << 30)
    seen = []
    sink.put("t0", torch.zeros(256, 256))
    sink.put("t1", torch.ones(256, 256))
    sink.after(lambda: seen.append(sink.bytes_written))
    sink.put("t2", torch.full((256, 256), 2.0))
    sink.after(lambda: seen.append(sink.bytes_written))
    files = sink.close()
    assert seen == [2 * 256 * 256 * 4, 3 * 256 * 256 * 4]
    got = load_file(tmp_path / "model.safetensors")
    assert [float(got[f"t{i}"][0, 0]) for i in range(3)] == [0.0, 1.0, 2.0]
    assert files["model.safetensors"] == hashlib.sha256((tmp_path / "model.safetensors").read_bytes()).hexdigest()


def test_after_all_runs_once_when_the_last_sink_has_written(tmp_path):
    """pack queues a copied tensor's page drop on every view's sink: it runs once, after the slowest."""
    import threading

    from tfcompile.artifact.sink import ShardSink, after_all

    spec = [TensorSpec("t", torch.float32, (64, 64))]
    a, b = ShardSink(tmp_path / "a", spec, 1 << 30), ShardSink(tmp_path / "b", spec, 1 << 30)
    gate, real = threading.Event(), b._write_now

    def held(name, tensor):
        gate.wait(10)
        real(name, tensor)

    b._queue._fn = held  # b's writer waits for the gate
    calls = []
    a.put("t", torch.zeros(64, 64))
    b.put("t", torch.zeros(64, 64))
    after_all([a, b], lambda: calls.append(b.bytes_written))
    a._queue.drain()
    assert calls == []  # a has written; b has not
    gate.set()
    b._queue.drain()
    assert calls == [64 * 64 * 4]
    a.close(), b.close()
