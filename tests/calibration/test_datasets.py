"""Calibration data: every source kind gives the same token blocks the tokenizer gives directly."""

from __future__ import annotations

import json
import os

import pytest
import torch

from tfcompile.calibration.datasets import calibration_tokens
from tfcompile.errors import UserError

DOCS = [f"document number {i} talks about quantization of weights and activations." for i in range(40)]


@pytest.fixture(scope="module")
def tok(tiny_llama_src):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_llama_src)


def _expected(tok, docs, seed, samples, seq_len):
    """The spec, computed independently: shuffle, tokenize, join with EOS, cut."""
    order = torch.randperm(len(docs), generator=torch.Generator().manual_seed(seed)).tolist()
    ids = []
    for i in order:
        ids += tok(docs[i], add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    return torch.tensor(ids[: samples * seq_len]).reshape(samples, seq_len)


def _write(kind, path):
    if kind == "txt":
        path.write_text("\n".join(DOCS) + "\n")
    elif kind == "jsonl":
        path.write_text("".join(json.dumps({"text": d, "id": i}) + "\n" for i, d in enumerate(DOCS)))
    elif kind == "csv":
        path.write_text("id,text\n" + "".join(f"{i},{d}\n" for i, d in enumerate(DOCS)))
    elif kind == "parquet":
        import datasets

        datasets.Dataset.from_dict({"text": DOCS}).to_parquet(str(path))
    elif kind == "saved":
        import datasets

        datasets.Dataset.from_dict({"body": DOCS}).save_to_disk(str(path))  # first string column
    return path


@pytest.mark.parametrize("kind", ["txt", "jsonl", "csv", "parquet", "saved"])
def test_sources_give_the_specified_blocks(kind, tok, tmp_path):
    src = _write(kind, tmp_path / (f"d.{kind}" if kind != "saved" else "saved"))
    got = calibration_tokens(str(src), tok, samples=3, seq_len=16, seed=7)
    assert got.dtype == torch.int64 and torch.equal(got, _expected(tok, DOCS, 7, 3, 16))


def test_random_and_self(tok, tiny_llama_src):
    from transformers import AutoModelForCausalLM

    r = calibration_tokens("random", tok, samples=2, seq_len=8, seed=1, vocab=256)
    assert torch.equal(r, torch.randint(0, 256, (2, 8), generator=torch.Generator().manual_seed(1)))
    model = AutoModelForCausalLM.from_pretrained(tiny_llama_src)
    state = torch.random.get_rng_state()
    a = calibration_tokens("self", tok, samples=2, seq_len=12, seed=3, model=model)
    b = calibration_tokens("self", tok, samples=2, seq_len=12, seed=3, model=model)
    assert a.shape == (2, 12) and torch.equal(a, b) and (a[:, 0] == tok.bos_token_id).all()
    assert torch.equal(torch.random.get_rng_state(), state)  # the caller's RNG is untouched


def test_self_packs_short_sequences_in_few_decode_steps(tok, tiny_llama_src, monkeypatch):
    """`self` samples SEQ_TOKENS-token sequences BATCH at a time and packs them: the decode
    steps follow the token count / BATCH, not seq_len (calibration/sampling.py)."""
    from transformers import AutoModelForCausalLM

    from tfcompile.calibration import sampling

    monkeypatch.setattr(sampling, "SEQ_TOKENS", 8)
    monkeypatch.setattr(sampling, "BATCH", 5)
    model = AutoModelForCausalLM.from_pretrained(tiny_llama_src)
    calls = []
    real = model.generate
    monkeypatch.setattr(model, "generate", lambda ids, **kw: calls.append((ids.shape[0], kw["max_new_tokens"]))
                        or real(ids, **kw))
    got = calibration_tokens("self", tok, samples=3, seq_len=20, seed=0, model=model)
    assert calls == [(5, 7), (3, 7)]  # 60 tokens = 8 sequences of 8: one call of 5, one of 3
    assert got.shape == (3, 20)
    flat = got.reshape(-1)
    assert (flat[::8] == tok.bos_token_id).all()  # every packed sequence starts at BOS
    assert torch.equal(got, calibration_tokens("self", tok, samples=3, seq_len=20, seed=0, model=model))


def test_self_on_an_encoder_falls_back_to_random(tok, tiny_llama_src):
    """`self` (the default) needs a model that can sample text; an encoder (BertModel, e.g.
    MiniLM) calibrates on random ids instead of failing in the calibrate pass."""
    from transformers import AutoModelForCausalLM, BertConfig, BertModel

    from tfcompile.calibration.datasets import effective_source

    bert = BertModel(BertConfig(vocab_size=256, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                intermediate_size=64))
    assert effective_source("self", bert) == "random"
    assert effective_source("self", AutoModelForCausalLM.from_pretrained(tiny_llama_src)) == "self"
    assert effective_source("python-doc", bert) == "python-doc"  # only `self` (and `auto`) fall back
    assert effective_source("auto", bert) == "random"  # no tokenizer: no python-doc
    got = calibration_tokens("self", tok, samples=2, seq_len=8, seed=1, model=bert, vocab=256)
    assert torch.equal(got, calibration_tokens("random", tok, samples=2, seq_len=8, seed=1, vocab=256))


def test_errors_name_the_source(tok, tmp_path):
    short = tmp_path / "short.txt"
    short.write_text("tiny\n")
    with pytest.raises(UserError, match="short.txt.*needed"):
        calibration_tokens(str(short), tok, samples=4, seq_len=64, seed=0)
    with pytest.raises(UserError, match="unknown file type"):
        calibration_tokens(str(_write("txt", tmp_path / "d.xyz")), tok, samples=1, seq_len=4, seed=0)
    with pytest.raises(UserError, match="no-such-dataset-xyz"):
        calibration_tokens("no-such-dataset-xyz", tok, samples=1, seq_len=4, seed=0)


def test_quantize_with_a_text_file(tiny_llama, tmp_path, run_cli):
    data = _write("txt", tmp_path / "calib.txt")
    out = tmp_path / "out"
    res = run_cli("quantize", tiny_llama, "-o", out, "--format", "fp8", "--calib", data,
                  "--calib-samples", "2", "--calib-seq-len", "16", "--json")
    assert res.code == 0, res.err
    assert res.json()["passes"]["calibrate"]["source"] == f"{data}(seed=0)"
    assert run_cli("quantize", tiny_llama, "-o", tmp_path / "o2", "--format", "nvfp4a16",
                   "--calib", data).code == 1  # weight-only: no calibrate pass to configure


def test_python_doc_source_uses_the_calib_split(tok):
    from tfcompile.calibration.corpus import python_doc_texts

    got = calibration_tokens("python-doc", tok, samples=2, seq_len=32, seed=5)
    assert torch.equal(got, _expected(tok, python_doc_texts("calib"), 5, 2, 32))


def test_auto_picks_python_doc_when_the_tokenizer_encodes_it(tok, tiny_llama_src):
    """The default `auto`: the python-doc calib split for a tokenizer that round-trips it and a
    vocabulary that holds its ids, `self` otherwise (calibration/datasets.py)."""
    from transformers import AutoModelForCausalLM

    from tfcompile.calibration.corpus import python_doc_texts
    from tfcompile.calibration.datasets import effective_source, text_encodes

    model = AutoModelForCausalLM.from_pretrained(tiny_llama_src)
    text = python_doc_texts("calib")[0][:4000]
    ids = tok(text, add_special_tokens=False)["input_ids"]
    faithful = "".join(tok.decode(ids).split()) == "".join(text.split())
    want = "python-doc" if faithful else "self"
    assert effective_source("auto", model, tok, vocab=max(ids) + 1, tokens=64) == want
    assert effective_source("auto", model, tok, vocab=max(ids), tokens=64) == "self"  # an id out of range
    assert effective_source("auto", model, None, tokens=64) == "self"  # no tokenizer
    assert not text_encodes("python-doc", tok, max(ids) + 1, 10**9)  # more tokens than the split holds
    got = calibration_tokens("auto", tok, samples=2, seq_len=32, seed=5, model=model, vocab=max(ids) + 1)
    assert torch.equal(got, calibration_tokens(want, tok, samples=2, seq_len=32, seed=5, model=model))


def test_offline_mode_is_scoped_to_the_load(tok, monkeypatch):
    """A data set name loads from the cache only (offline for that call) and leaves the process's
    offline settings as they were: no HF_DATASETS_OFFLINE in the environment afterwards."""
    import datasets
    import huggingface_hub.constants as hub

    from tfcompile.calibration import datasets as calib_datasets

    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(hub, "HF_HUB_OFFLINE", False)
    seen = {}

    def fake_load(name, split):
        seen["offline"] = (datasets.config.HF_HUB_OFFLINE, hub.HF_HUB_OFFLINE)
        raise FileNotFoundError(name)

    monkeypatch.setattr(datasets, "load_dataset", fake_load)
    with pytest.raises(UserError, match="some-cached-set"):
        calib_datasets.calibration_tokens("some-cached-set", tok, samples=1, seq_len=4, seed=0)
    assert seen["offline"] == (True, True)
    assert (datasets.config.HF_HUB_OFFLINE, hub.HF_HUB_OFFLINE) == (False, False)
    assert "HF_DATASETS_OFFLINE" not in os.environ
