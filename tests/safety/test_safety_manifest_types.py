"""Issue 24, case 8: a manifest that passes the schema check's required fields but has odd types
in the fields report and inspect read (tfcompile/artifact/fields.py), and `report --eval` files
with odd types: exit 1 naming the field, never a traceback."""

from __future__ import annotations

import json
import shutil

import pytest

from safety_helpers import quantize_to

HUB = {"repo_id": "org/name", "commit": "a" * 40}
EVAL = {"ok": True, "metrics": {"perplexity": 2.0, "reference_perplexity": 1.9, "ppl_increase": 0.05,
                                "kl_mean": 0.01, "kl_max": 0.1, "top1_agreement": 0.9, "tokens": 64},
        "text": {"source": "file:x", "sequences": 1}, "gates": []}


@pytest.fixture(scope="module")
def artifact(tiny_llama_src, tmp_path_factory):
    return quantize_to(tiny_llama_src, tmp_path_factory.mktemp("art") / "art")


def _edited(artifact, tmp_path, edit):
    art = tmp_path / "edited"
    shutil.copytree(artifact, art)
    path = art / "tfcompile/manifest.json"
    doc = json.loads(path.read_text())
    doc["source"]["hub"], doc["eval"] = dict(HUB), json.loads(json.dumps(EVAL))
    edit(doc)
    path.write_text(json.dumps(doc))
    return art


def _set(path, value):
    def edit(doc):
        *parents, last = path.split(".")
        for p in parents:
            doc = doc[p]
        if value is KeyError:
            del doc[last]
        else:
            doc[last] = value
    return edit


CASES = [("source.name", 7), ("source.name", [1]), ("summary.median_sqnr_db", "x"), ("eval.metrics", KeyError),
         ("source.hub.repo_id", 7), ("source.hub.commit", None), ("eval.gates", None), ("eval.text", None),
         ("eval.metrics.perplexity", "high"), ("scheme.kv_cache", "x"), ("dependencies", [1]), ("tool", KeyError),
         ("summary.bytes_in", KeyError), ("source.files", 7), ("source", None)]


@pytest.mark.parametrize("field,value", CASES, ids=[f"{f}={v if v is not KeyError else 'missing'}"
                                                    for f, v in CASES])
@pytest.mark.parametrize("command", ["inspect", "report", "verify"])
def test_odd_types_in_a_manifest_are_a_user_error(field, value, command, artifact, tmp_path, run_cli):
    art = _edited(artifact, tmp_path, _set(field, value))
    args = {"inspect": ("inspect", art), "report": ("report", art, "-o", tmp_path / "r.html"),
            "verify": ("verify", art)}[command]
    res = run_cli(*args)
    assert res.code == 1 and "Traceback" not in res.err and "hint: " in res.err, (res.code, res.err)
    assert field in res.err or field.rpartition(".")[0] in res.err, res.err
    assert not (tmp_path / "r.html").exists()


def test_the_fields_in_their_right_types_render(artifact, tmp_path, run_cli):
    art = _edited(artifact, tmp_path, lambda doc: None)
    assert run_cli("inspect", art).code == 0
    res = run_cli("report", art, "-o", tmp_path / "r.html")
    assert res.code == 0, res.err
    assert "org/name" in (tmp_path / "r.html").read_text()


@pytest.mark.parametrize("edit,needle", [
    (lambda d: d["metrics"].update(kl_mean="x"), "metrics.kl_mean"),
    (lambda d: d.update(gates=[{"gate": "max-kl", "metric": 5, "value": 1, "threshold": 2, "ok": True}]),
     "gates[0].metric"),
    (lambda d: d.update(layer_kl=[{"layer": "0"}]), "layer_kl[0].layer"),
    (lambda d: d.update(kv_cache={"dtype": "fp8", "strategy": ["tensor"]}), "kv_cache.strategy"),
])
def test_odd_types_in_an_eval_file_are_a_user_error(edit, needle, artifact, tmp_path, run_cli):
    doc = json.loads(json.dumps(EVAL))
    edit(doc)
    f = tmp_path / "eval.json"
    f.write_text(json.dumps(doc))
    res = run_cli("report", artifact, "--eval", f, "-o", tmp_path / "r.html")
    assert res.code == 1 and "Traceback" not in res.err and needle in res.err and str(f) in res.err, res.err
