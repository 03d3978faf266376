"""`tfcompile report` and `quantize --report`: what the page holds, where it lives, determinism."""

from __future__ import annotations

import hashlib
import json
from html.parser import HTMLParser
from pathlib import Path

from report_support import quantize_args, run_main


class Tags(HTMLParser):
    """Counts elements by (tag, class) and collects ids, text and every URL-valued attribute."""

    def __init__(self):
        super().__init__()
        self.count: dict[tuple[str, str], int] = {}
        self.ids: set[str] = set()
        self.urls: list[str] = []
        self.text: list[str] = []
        self.scripts = 0

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        for cls in (a.get("class") or "").split() or [""]:
            self.count[(tag, cls)] = self.count.get((tag, cls), 0) + 1
        self.ids |= {a["id"]} if "id" in a else set()
        self.urls += [v for k, v in attrs if k in ("src", "href", "xlink:href") and v]
        self.scripts += tag == "script"

    def handle_data(self, data):
        self.text.append(data)


def parse(html: str) -> Tags:
    t = Tags()
    t.feed(html)
    return t


def test_the_page_has_every_section_and_its_figures(reported):
    out, _ = reported
    html = (out / "tfcompile" / "report.html").read_text()
    t = parse(html)
    manifest = json.loads((out / "tfcompile" / "manifest.json").read_text())
    assert {"summary", "eval", "gates", "layers", "weight-sqnr", "eval-sqnr", "layer-kl", "formats", "kernels",
            "provenance"} <= t.ids
    assert t.count[("rect", "bar")] == manifest["summary"]["quantized_linears"] == 14  # one bar per Linear
    assert t.count[("circle", "point")] == 2 * 14 + 2  # eval SQNR (isolated, e2e) per Linear + KL per layer
    assert t.scripts == 0 and t.urls == []  # nothing to run, nothing to fetch
    assert "default-src 'none'" in html  # and the page forbids fetching anyway
    text = " ".join(t.text)
    assert "sm_100a" in text and "fp8_e4m3" in text and "pass" in text and "--max-kl" in text
    assert manifest["integrity"]["sha256"] in text  # the digest the page quotes: verify checks it
    kl = manifest["eval"]["layer_kl"]
    assert [r["layer"] for r in kl] == [0, 1]
    assert abs(kl[-1]["kl_mean"] - manifest["eval"]["metrics"]["kl_mean"]) <= 1e-5 * kl[-1]["kl_mean"]  # 6 digits


def test_report_is_recorded_beside_the_checksums(reported):
    """Not in `files` (the page quotes the manifest's digest), but its sha256 in the integrity entry."""
    out, _ = reported
    manifest = json.loads((out / "tfcompile/manifest.json").read_text())
    assert "tfcompile/report.html" not in manifest["files"]
    page = (out / "tfcompile/report.html").read_bytes()
    assert manifest["integrity"]["report_sha256"] == hashlib.sha256(page).hexdigest()
    assert run_main(["verify", out])[0] == 0


def test_without_report_the_artifact_is_unchanged(reported, report_text, tmp_path):
    """No --report: no page, the eval section keeps its summary-only form, every other file is
    byte for byte the same (and reruns are byte-identical: tests/cli/test_quantize.py)."""
    out, src = reported
    plain = tmp_path / "plain"
    assert run_main(quantize_args(src, plain, report_text))[0] == 0
    assert not (plain / "tfcompile/report.html").exists()
    section = json.loads((plain / "tfcompile/manifest.json").read_text())["eval"]
    assert set(section) == {"ok", "activations", "dtype", "text", "kv_cache", "metrics", "layer_summary", "gates"}
    full = json.loads((out / "tfcompile/manifest.json").read_text())
    assert {k: v for k, v in full["eval"].items() if k not in ("layers", "layer_kl", "layer_kl_positions")} == section
    same = {p.relative_to(plain) for p in plain.rglob("*") if p.is_file()} - {Path("tfcompile/manifest.json")}
    assert same == {p.relative_to(out) for p in out.rglob("*") if p.is_file()} - {
        Path("tfcompile/manifest.json"), Path("tfcompile/report.html")}
    assert all((plain / p).read_bytes() == (out / p).read_bytes() for p in same)
    manifest = json.loads((plain / "tfcompile/manifest.json").read_text())
    assert {k: v for k, v in full.items() if k not in ("eval", "recipe", "integrity")} == \
        {k: v for k, v in manifest.items() if k not in ("eval", "recipe", "integrity")}


def test_report_command_default_path_stdout_and_json(reported, tmp_path, monkeypatch):
    out, _ = reported
    code, stdout, err = run_main(["report", out, "-o", tmp_path / "r.html", "--json"])
    assert code == 0, err
    doc = json.loads(stdout)
    page = (tmp_path / "r.html").read_bytes()
    assert doc["ok"] and doc["sha256"] == hashlib.sha256(page).hexdigest()
    assert page == (out / "tfcompile/report.html").read_bytes()  # the same page as quantize --report
    code, stdout, _ = run_main(["report", out, "-o", "-"])
    assert code == 0 and stdout.encode() == page
    code, _, err = run_main(["report", out])
    assert code == 0 and (out.parent / f"{out.name}-report.html").read_bytes() == page


def test_report_with_an_eval_json(reported, report_text, tmp_path):
    """A plain --eval artifact has no per-layer eval rows; `eval --json --layer-kl` supplies them."""
    out, src = reported
    code, stdout, err = run_main(["eval", out, "--reference", src, "--text", report_text, "--max-tokens", "128",
                                  "--layer-kl", "--json"])
    assert code == 0, err
    (tmp_path / "eval.json").write_text(stdout)
    code, _, err = run_main(["report", out, "-o", tmp_path / "r.html", "--eval", tmp_path / "eval.json"])
    assert code == 0, err
    t = parse((tmp_path / "r.html").read_text())
    assert t.count[("circle", "point")] == 2 * 14 + 2
    (tmp_path / "bad.json").write_text('{"not": "an eval"}')
    code, _, err = run_main(["report", out, "--eval", tmp_path / "bad.json", "-o", tmp_path / "x.html"])
    assert code == 1 and "not a `tfcompile eval --json` document" in err and "hint:" in err
    assert not (tmp_path / "x.html").exists()


def test_markup_from_the_manifest_is_escaped(hostile_artifact, tmp_path):
    code, _, err = run_main(["report", hostile_artifact, "-o", tmp_path / "r.html"])
    assert code == 0, err
    html = (tmp_path / "r.html").read_text()
    assert "<script>" not in html and "<img" not in html
    assert "&lt;script&gt;alert(2)&lt;/script&gt;" in html and "onerror=&quot;alert(1)&quot;" in html
    assert parse(html).scripts == 0


def test_lens_kl_is_zero_against_itself_and_the_last_layer_is_the_model_kl(reported, report_text):
    """Oracles for KL per layer: a checkpoint against itself is 0 at every layer; the last layer's
    figure is the model's own KL(ref || model) (same norm and head)."""
    out, src = reported
    code, stdout, err = run_main(["eval", src, "--reference", src, "--text", report_text, "--max-tokens", "128",
                                  "--layer-kl", "--json", "--no-layers"])
    assert code == 0, err
    assert [r["kl_mean"] for r in json.loads(stdout)["layer_kl"]] == [0.0, 0.0]
    code, stdout, _ = run_main(["eval", out, "--reference", src, "--text", report_text, "--max-tokens", "128",
                                "--layer-kl", "--json"])
    doc = json.loads(stdout)
    assert all(r["kl_mean"] > 0 for r in doc["layer_kl"])
    assert abs(doc["layer_kl"][-1]["kl_mean"] - doc["metrics"]["kl_mean"]) < 1e-6


def test_the_command_rebuilds_the_artifact_and_holds_no_path(reported, tmp_path):
    """The page's command (MODEL -o OUT --recipe recipe.json, with the recipe the page shows)
    builds the same recipe and the same tensors again; the page holds no path of this run."""
    import html as html_mod
    import re

    out, src = reported
    page = (out / "tfcompile" / "report.html").read_text()
    assert "<code>tfcompile quantize MODEL -o OUT --recipe recipe.json</code>" in page
    assert str(out) not in page and str(src) not in page  # OUT and MODEL are placeholders
    shown = re.search(r"<summary>recipe \(recipe\.json\)</summary><pre>(.*?)</pre>", page, re.S).group(1)
    (tmp_path / "recipe.json").write_text(html_mod.unescape(shown))
    again = tmp_path / "again"
    code, _, err = run_main(["quantize", src, "-o", again, "--recipe", tmp_path / "recipe.json", "-q"])
    assert code == 0, err[-3000:]
    one, two = (json.loads((d / "tfcompile" / "manifest.json").read_text()) for d in (out, again))
    assert two["recipe"] == one["recipe"]
    assert (again / "model.safetensors").read_bytes() == (out / "model.safetensors").read_bytes()


def test_the_command_names_a_hub_source_by_id_and_commit():
    from tfcompile.report.page import rebuild_command

    hub = {"source": {"hub": {"repo_id": "org/model", "commit": "0" * 40}}, "recipe": {"passes": [{"name": "load"}]}}
    assert rebuild_command(hub) == f"tfcompile quantize org/model --revision {'0' * 40} -o OUT --recipe recipe.json"
    distilled = {"source": {}, "recipe": {"passes": [{"name": "distill"}]}}
    assert rebuild_command(distilled) == "tfcompile distill MODEL -o OUT --recipe recipe.json"
    assert rebuild_command({"recipe": "not a recipe"}) == "tfcompile quantize MODEL -o OUT --recipe recipe.json"
