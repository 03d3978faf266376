"""The lm-eval adapter (`tfcompile` model) against lm-eval's own `hf` model: the oracle of the task gates."""

from __future__ import annotations

import json

import pytest

from conftest import DEMO  # noqa: E402  (tests/tasks/conftest.py, on sys.path under pytest's rootdir)

import lm_eval  # the eval extra (in the test extra too): a missing install fails loudly

LIMIT = 40  # documents (4 requests each)


def _evaluate(model, cloze_yaml, **kw):
    from lm_eval.tasks import TaskManager

    tm = TaskManager(include_path=str(cloze_yaml.parent))
    return lm_eval.simple_evaluate(model=model, tasks=["pydoc_cloze"], task_manager=tm, limit=LIMIT,
                                   log_samples=True, bootstrap_iters=0, **kw)


def test_reference_equals_lm_eval_hf_model(cloze_yaml):
    """Same accuracy, and every request's log-likelihood within float tolerance, as `--model hf
    --model_args pretrained=examples/demo-lm,dtype=float32` (HFLM: transformers' own forward)."""
    from tfcompile.tasks.adapter import TfcompileLM

    ours = _evaluate(TfcompileLM(pretrained=str(DEMO), device="cpu"), cloze_yaml)
    hf = _evaluate("hf", cloze_yaml, model_args=f"pretrained={DEMO},dtype=float32", device="cpu")
    a, b = ours["results"]["pydoc_cloze"], hf["results"]["pydoc_cloze"]
    assert a["acc,none"] == b["acc,none"] and a["acc_norm,none"] == b["acc_norm,none"]
    sa, sb = ours["samples"]["pydoc_cloze"], hf["samples"]["pydoc_cloze"]
    assert [s["doc_id"] for s in sa] == [s["doc_id"] for s in sb] and len(sa) == LIMIT
    for x, y in zip(sa, sb):
        assert x["arguments"] == y["arguments"]  # the same requests (context, continuation)
        for (ll_a, greedy_a), (ll_b, greedy_b) in ((r[0], q[0]) for r, q in zip(x["resps"], y["resps"])):
            assert ll_a == pytest.approx(ll_b, abs=1e-4, rel=1e-5) and greedy_a == greedy_b
    # the demo LM (never trained on these splits) is well above chance (1 in 4) on the task
    assert a["acc,none"] >= 0.4


def test_registered_as_tfcompile_and_scores_an_artifact_path(cloze_yaml):
    """`simple_evaluate(model="tfcompile", model_args="pretrained=...")` after importing the adapter."""
    import tfcompile.tasks.adapter  # noqa: F401  (registers `tfcompile`)
    from lm_eval.api.registry import get_model

    assert get_model("tfcompile").__name__ == "TfcompileLM"
    out = _evaluate("tfcompile", cloze_yaml, model_args=f"pretrained={DEMO}")
    assert 0.4 <= out["results"]["pydoc_cloze"]["acc,none"] <= 1.0


def test_rolling_and_generate():
    """loglikelihood_rolling equals lm-eval's hf model's (every token of the string scored after the
    BOS prefix, in windows); generate_until stops at the `until` string."""
    from lm_eval.api.instance import Instance
    from lm_eval.models.huggingface import HFLM

    from tfcompile.tasks.adapter import TfcompileLM

    lm = TfcompileLM(pretrained=str(DEMO), device="cpu")
    hf = HFLM(pretrained=str(DEMO), dtype="float32", device="cpu")
    texts = ["The module provides functions for working with files and directories.",
             " ".join(["Each window of the model's maximum length is scored on its own."] * 30)]  # > 256 tokens
    reqs = [Instance("loglikelihood_rolling", {}, (t,), i) for i, t in enumerate(texts)]
    assert len(lm.tok_encode(texts[1])) > lm.max_length
    for ours, theirs in zip(lm.loglikelihood_rolling(reqs), hf.loglikelihood_rolling(reqs, disable_tqdm=True)):
        assert ours == pytest.approx(theirs, abs=1e-3, rel=1e-5)
    [out] = lm.generate_until([Instance("generate_until", {}, ("The", {"until": ["."], "max_gen_toks": 12}), 0)])
    assert isinstance(out, str) and "." not in out


def test_task_yaml_and_data_are_deterministic(cloze_yaml, tmp_path):
    from tfcompile.tasks import cloze

    again = cloze.build(tmp_path / "again")
    rows = [json.loads(line) for line in (cloze_yaml.parent / "pydoc_cloze.jsonl").read_text().splitlines()]
    assert (again.parent / "pydoc_cloze.jsonl").read_bytes() == (cloze_yaml.parent / "pydoc_cloze.jsonl").read_bytes()
    assert len(rows) == cloze.DOCS
    for r in rows:
        assert len(r["choices"]) == 4 and len(set(r["choices"])) == 4 and 0 <= r["label"] < 4
        assert r["context"] and not r["context"].endswith(" ")
    assert str(cloze_yaml.parent.resolve()) in cloze_yaml.read_text() and "@DATA_DIR@" not in cloze_yaml.read_text()
