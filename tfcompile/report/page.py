"""The report as one self-contained HTML page: inline CSS and SVG, no script, and a
Content-Security-Policy that forbids every fetch, so it renders the same offline, from a CI
artifact store or a mail attachment. Deterministic: no dates, no timings, sorted keys."""

from __future__ import annotations

import json
from html import escape

from tfcompile import __version__
from tfcompile.artifact.manifest import kv_cache_text
from tfcompile.evaluate.kvtext import LENS_MAX_POSITIONS as LENS_POSITIONS, describe
from tfcompile.report import svg
from tfcompile.report.data import ReportData, decoder_layer, model_order, projection

CSP = "default-src 'none'; style-src 'unsafe-inline'; img-src data:"
CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:0;color:#1d2330;background:#f5f6f8}
main{max-width:1040px;margin:0 auto;padding:24px}
h1{font-size:22px;margin:0 0 4px}h2{font-size:17px;margin:28px 0 10px;border-bottom:1px solid #d8dbe2;padding-bottom:4px}
.sub{color:#5b6474;margin:0 0 16px}.cards{display:grid;grid-template-columns:repeat(auto-fill,minmax(180px,1fr));gap:10px}
.card{background:#fff;border:1px solid #d8dbe2;border-radius:8px;padding:10px 12px}
.card b{display:block;font-size:18px}.card span{color:#5b6474;font-size:12px}
table{border-collapse:collapse;background:#fff;width:100%;font-size:13px}th,td{border:1px solid #e1e4ea;padding:4px 8px;text-align:left}
th{background:#eef0f4}td.num{text-align:right;font-variant-numeric:tabular-nums}code{font-size:12px}
.pass{color:#1f7a3a;font-weight:600}.fail{color:#b3261e;font-weight:600}.note{color:#5b6474;font-size:13px}
figure{margin:0 0 14px;background:#fff;border:1px solid #d8dbe2;border-radius:8px;padding:8px}
figcaption{font-size:13px;color:#3b4352;margin:0 0 4px}svg.chart{width:100%;height:auto;display:block}
.plot-bg{fill:#fbfbfd}.grid{stroke:#e4e6eb}.sep{stroke:#c5c9d2;stroke-dasharray:2 3}
.tick{font-size:11px;fill:#5b6474}.axis{font-size:12px;fill:#3b4352}.legend{font-size:11px;fill:#3b4352}
details{background:#fff;border:1px solid #d8dbe2;border-radius:8px;padding:6px 10px;margin:8px 0}pre{overflow:auto;font-size:12px}
"""


def render(d: ReportData) -> str:
    m = d.manifest
    body = [f"<h1>{escape(d.name)}: {escape(m['scheme']['name'])}</h1>",
            f'<p class="sub">tfcompile {escape(str(m["tool"]["version"]))} artifact; manifest digest '
            f"<code>{d.manifest_digest}</code></p>",
            summary(d), evaluation(d), layer_plots(d), formats(d), kernels(d), provenance(d)]
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f'<meta http-equiv="Content-Security-Policy" content="{CSP}">'
            '<meta name="viewport" content="width=device-width, initial-scale=1">'
            f"<title>tfcompile report: {escape(d.name)}</title><style>{CSS}</style></head>"
            f'<body><main>{"".join(body)}<p class="note">Written by <code>tfcompile report</code> '
            f"{escape(__version__)}.</p></main></body></html>\n")


def _card(value: str, label: str) -> str:
    return f'<div class="card"><b>{escape(value)}</b><span>{escape(label)}</span></div>'


def _table(head: list[str], rows: list[list[str]], num: set[int] = frozenset()) -> str:
    """Cells are already-escaped HTML; `num` = right-aligned column indexes."""
    th = "".join(f"<th>{escape(h)}</th>" for h in head)
    tr = "".join("<tr>" + "".join(f'<td{" class=num" if i in num else ""}>{c}</td>' for i, c in enumerate(r))
                 + "</tr>" for r in rows)
    return f"<table><thead><tr>{th}</tr></thead><tbody>{tr}</tbody></table>"


def _mib(n: int | None) -> str:
    return "-" if n is None else f"{n / 2**20:,.2f} MiB"


def summary(d: ReportData) -> str:
    s, sc = d.manifest["summary"], d.manifest["scheme"]
    worst = s.get("worst_sqnr_db")
    cards = [_card(sc["name"], f"{sc['weight']}, {sc['granularity']}" + (f" {sc['block']}" if sc.get("block") else "")),
             _card(str(s["quantized_linears"]), "quantized Linears"),
             _card(_mib(s["bytes_in"]), "source tensors"), _card(_mib(s["bytes_out"]), "artifact tensors"),
             _card(f"{s['compression_ratio']}x" if s.get("compression_ratio") else "-", "compression"),
             _card("-" if worst is None else f"{worst:.2f} dB", "worst weight SQNR"),
             _card("-" if s.get("median_sqnr_db") is None else f"{s['median_sqnr_db']:.2f} dB", "median weight SQNR")]
    ev = d.evaluation
    if ev:
        cards.append(_card("pass" if ev.get("ok") else "FAIL", f"eval gates ({len(ev.get('gates', []))})"))
    acts = sc.get("activations") or "not quantized (weight-only)"
    return (f'<h2 id="summary">Summary</h2><div class="cards">{"".join(cards)}</div>'
            f'<p class="note">Activations: {escape(str(acts))}. KV cache: {escape(kv_cache_text(d.manifest))}. '
            f'Views: {escape(", ".join(d.manifest.get("views", [])))}.</p>')


def evaluation(d: ReportData) -> str:
    ev = d.evaluation
    if not ev:
        return ('<h2 id="eval">Evaluation</h2><p class="note">Not evaluated: build with '
                "<code>tfcompile quantize --eval --report</code>, or give <code>tfcompile report --eval "
                "eval.json</code> (from <code>tfcompile eval --json</code>).</p>")
    m, t = ev["metrics"], ev.get("text", {})

    def f(v, spec=".4f"):
        return "-" if v is None else format(v, spec)

    rows = [["perplexity", f"{f(m['perplexity'])} (reference {f(m['reference_perplexity'])}, "
             f"{f(None if m.get('ppl_increase') is None else 100 * m['ppl_increase'], '+.2f')}%)"],
            ["KL(ref ‖ model)", f"{f(m['kl_mean'], '.6f')} nats/token (max {f(m.get('kl_max'), '.4f')})"],
            ["top-1 agreement", f(m["top1_agreement"])],
            ["tokens", escape(f"{m['tokens']} ({t.get('source', '?')}, {t.get('sequences', '?')} sequences)")],
            ["KV cache", escape(describe(ev.get("kv_cache")))]]
    gates = [[escape(f"--{g['gate']}"), escape(g["metric"]), f(g["value"], ".6g"), f(g["threshold"], "g"),
              _result(g["ok"])] for g in ev.get("gates", [])]
    gate_html = (_table(["gate", "metric", "value", "threshold", "result"], gates, {2, 3}) if gates
                 else '<p class="note">No gate was given (--max-kl, --max-ppl-increase, --min-top1).</p>')
    return (f'<h2 id="eval">Evaluation</h2>{_table(["metric", "value"], rows)}'
            f'<h2 id="gates">Eval gates</h2>{gate_html}{_tasks(ev.get("tasks") or [])}'
            f'{_worst(ev.get("worst_layers") or [])}')


def _result(ok: bool) -> str:
    return f'<span class="{"pass" if ok else "fail"}">{"pass" if ok else "FAIL"}</span>'


def _tasks(tasks: list[dict]) -> str:
    """The task gates (lm-evaluation-harness): both scores in points, the drop, the limit."""
    if not tasks:
        return ""
    rows = [[escape(t["task"]), escape(t["metric"]), f"{t['reference']:.2f}", f"{t['candidate']:.2f}",
             f"{t['drop']:.2f}", "-" if t.get("threshold") is None else f"{t['threshold']:g}", _result(t["passed"])]
            for t in tasks]
    return ('<h2 id="tasks">Task gates</h2><p class="note">lm-evaluation-harness tasks scored on the artifact as '
            "served (emulated) and on the reference; points = metric x 100.</p>"
            + _table(["task", "metric", "reference", "candidate", "drop", "max drop", "result"], rows, {2, 3, 4, 5}))


def _worst(worst: list[dict]) -> str:
    """A missed gate's worst layers: the usual --ignore candidates."""
    if not worst:
        return ""
    rows = [[f"<code>{escape(w['module'])}</code>", "-" if w["sqnr_db"] is None else f"{w['sqnr_db']:.2f}",
             "-" if w.get("e2e_sqnr_db") is None else f"{w['e2e_sqnr_db']:.2f}",
             "-" if w.get("noise_share") is None else f"{100 * w['noise_share']:.0f}%"] for w in worst]
    return ('<h2 id="worst">Worst layers</h2><p class="note">Lowest output SQNR first; share = of the summed '
            "relative output noise. Leave them in BF16 with <code>--ignore</code>, or choose a stronger "
            "<code>--format</code>.</p>" + _table(["module", "isolated dB", "end to end dB", "share"], rows, {1, 2, 3}))


def layer_plots(d: ReportData) -> str:
    layers = sorted(d.manifest.get("layers", []), key=lambda la: model_order(la["module"]))
    out = ['<h2 id="layers">Per-layer figures</h2>']
    out.append(_figure("weight-sqnr", "Weight SQNR per quantized Linear (dB; 10·log10 Σw² / Σ(w − ŵ)², "
                       "higher is better), in model order", _sqnr_bars(layers, "sqnr_db", "weight SQNR")))
    ev = d.evaluation or {}
    if ev.get("layers"):
        out.append(_figure("eval-sqnr", "Output SQNR per Linear on the evaluation tokens (dB): isolated = the "
                           "reference's input, end to end = in the quantized model", _eval_sqnr(ev["layers"])))
    if ev.get("layer_kl"):
        pts = [(r["layer"], r["kl_mean"], f"layer {r['layer']}: KL {r['kl_mean']:.3g} nats/token")
               for r in ev["layer_kl"]]
        chart = svg.line_chart({"KL(ref ‖ model) after this layer": pts}, ylabel="nats/token",
                               xlabel="decoder layer (logit lens)", cls="layer-kl",
                               xticks=[(p[0], str(int(p[0]))) for p in pts])
        out.append(_figure("layer-kl", "KL per decoder layer: both models' hidden states after layer i read "
                           "through their own final norm and lm_head" + _lens_positions(ev), chart))
    elif ev:
        out.append('<p class="note">KL per layer: not recorded (quantize --eval --report, or eval --layer-kl).</p>')
    return "".join(out)


def _lens_positions(ev: dict) -> str:
    """Which positions the lens covers, so its last point and the table's KL can be compared."""
    tokens = (ev.get("metrics") or {}).get("tokens")
    if not isinstance(tokens, int):
        return " (the last one is the model's KL)"
    n = ev.get("layer_kl_positions")
    if not isinstance(n, int):  # recorded before the lens spread its positions: it took the first ones
        n = min(tokens, LENS_POSITIONS)
        if n < tokens:
            return (f", on the first {n} of the {tokens} evaluation positions (the last one is the model's KL on "
                    f"those positions; the table's KL is over all {tokens})")
    if n >= tokens:
        return f", on all {tokens} evaluation positions (the last one is the table's KL)"
    return (f", on {n} of the {tokens} evaluation positions spread evenly over the text (the last one is the "
            f"model's KL on those positions; the table's KL is over all {tokens})")


def _figure(fid: str, caption: str, chart: str) -> str:
    body = chart or '<p class="note">No figures.</p>'
    return f'<figure id="{fid}"><figcaption>{escape(caption)}</figcaption>{body}</figure>'


def _groups(modules: list[str]) -> list[tuple[int, str]]:
    out, last = [], None
    for i, mod in enumerate(modules):
        layer = decoder_layer(mod)
        if layer != last and layer is not None:
            out.append((i, f"L{layer}"))
        last = layer
    step = max(1, len(out) // 16)  # at most ~16 labels
    return out[::step]


def _sqnr_bars(layers: list[dict], key: str, what: str) -> str:
    rows = [la for la in layers if la.get(key) is not None]
    bars = [svg.Bar(f"{la['module']} {'x'.join(map(str, la.get('shape', [])))} {la.get('format', '')}: "
                    f"{what} {la[key]:.2f} dB", la[key], projection(la["module"])) for la in rows]
    return svg.bar_chart(bars, ylabel="dB", xlabel="quantized Linear (decoder layer order)",
                         groups=_groups([la["module"] for la in rows]), cls="sqnr", zero=False)


def _eval_sqnr(rows: list[dict]) -> str:
    rows = sorted(rows, key=lambda r: model_order(r["module"]))
    series = {}
    for key, name in (("sqnr_db", "isolated"), ("e2e_sqnr_db", "end to end")):
        series[name] = [(i, r[key], f"{r['module']}: {name} {r[key]:.2f} dB")
                        for i, r in enumerate(rows) if r.get(key) is not None]
    ticks = [(float(i), label) for i, label in _groups([r["module"] for r in rows])]
    return svg.line_chart(series, ylabel="dB", xlabel="quantized Linear (decoder layer order)",
                          cls="eval-sqnr", xticks=ticks, zero=False)


def formats(d: ReportData) -> str:
    m = d.manifest
    by_fmt: dict[str, list] = {}
    for la in m.get("layers", []):
        by_fmt.setdefault(f"{la.get('format')} ({la.get('algorithm', 'rtn')})", []).append(la)
    rows = [[escape(k), str(len(v)), f"{sum(x['shape'][0] * x['shape'][1] for x in v):,}"]
            for k, v in sorted(by_fmt.items())]
    files = [[f"<code>{escape(rel)}</code>", _mib(n)] for rel, n in d.sizes.items()]
    ignored = ", ".join(f"<code>{escape(x)}</code>" for x in m.get("ignore", [])) or "none"
    return (f'<h2 id="formats">Formats and sizes</h2>{_table(["format (algorithm)", "Linears", "weights"], rows, {1, 2})}'
            f'<p class="note">Left in the source dtype: {ignored}.</p>'
            f'<details><summary>{len(files)} files, {_mib(sum(d.sizes.values()))}</summary>'
            f'{_table(["file", "size"], files, {1})}</details>')


def kernels(d: ReportData) -> str:
    out = ['<h2 id="kernels">Kernels and targets</h2>']
    tri = d.triton
    if tri:
        rows = [[escape(t), escape(", ".join(v.get("gemm", [])) or "-"), escape(", ".join(v.get("act_quant", [])) or "-"),
                 str(sum(k.get("target") == t for k in tri.get("kernels", []))), escape(v.get("note", ""))]
                for t, v in sorted(tri.get("targets", {}).items())]
        out.append(_table(["target", "GEMM (Triton)", "activation quant", "cubins", "note"], rows, {3}))
    cut = d.manifest.get("cutlass")
    if cut:
        rows = [[escape(t), str(len(v.get("sources", []))), escape(v.get("note", ""))]
                for t, v in sorted(cut.get("targets", {}).items())]
        state = "compiled with nvcc" if cut.get("compiled") else f"sources only ({cut.get('why_not')})"
        out.append(f'<p class="note">CUTLASS {escape(str(cut.get("version")))}: {escape(state)}.</p>'
                   + _table(["target", "CUTLASS sources", "note"], rows, {1}))
    if d.kv:  # every field escaped: kv_cache.json is a file of the artifact, input like the manifest
        kv = {k: escape(str(d.kv.get(k))) for k in ("engine", "dtype", "layout", "block_size", "tp", "rope")}
        out.append(f'<p class="note">KV cache for {kv["engine"]}: {kv["dtype"]}, {kv["layout"]} pages of '
                   f'{kv["block_size"]} tokens, TP {kv["tp"]}, RoPE {kv["rope"]} (tfcompile/kv_cache.json).</p>')
    if len(out) == 1:
        out.append('<p class="note">No GPU kernels in this artifact (quantize --target sm_90a,sm_100a adds them).</p>')
    return "".join(out)


def _signature(sig: dict | None) -> str:
    """Signed, and by which key (the key id, sha256 of the public key); `verify --public-key` checks it."""
    if not sig:
        return ("not signed when this page was written (a <code>--sign</code> signature is added after the "
                "report; <code>tfcompile verify OUT --public-key PUB</code> checks it)")
    return (f"{escape(str(sig.get('algorithm')))}, key id <code>{escape(str(sig.get('key_id')))}</code> "
            "(checked by <code>tfcompile verify --public-key</code>, not by this page)")


def provenance(d: ReportData) -> str:
    m = d.manifest
    src = m.get("source", {})
    hub = src.get("hub")
    rows = [["source", escape(str(src.get("name")))], ["architecture", escape(str(src.get("architecture")))],
            ["source dtype", escape(str(src.get("dtype")))]]
    if hub:
        rows.append(["Hugging Face Hub", f"{escape(hub['repo_id'])} @ <code>{escape(hub['commit'])}</code>"])
    rows += [[f"<code>{escape(k)}</code>", f"sha256 <code>{escape(v)}</code>"] for k, v in sorted(src.get("files", {}).items())]
    calib = m.get("calibration")
    if isinstance(calib, dict):  # the data calibration really used, and auto's fallback (passes/calibrate.py)
        rows.append(["calibration data", f"{escape(str(calib.get('data')))}, {escape(str(calib.get('tokens')))} tokens"])
        if calib.get("fallback"):
            rows.append(["calibration fallback", f'<span class="fail">{escape(str(calib["fallback"]))}</span>'])
    rows.append(["signature", _signature(d.signature)])
    rows.append(["built by", f"tfcompile {escape(str(m['tool']['version']))}"])
    rows.append(["command", f"<code>{escape(rebuild_command(m))}</code> "
                 '<span class="note">(rebuilds these tensors; recipe.json: the recipe below)</span>'])
    rows += [[escape(k), escape(str(v))] for k, v in sorted(m.get("dependencies", {}).items())]
    recipe = escape(json.dumps(recipe_file(m.get("recipe")), indent=2, sort_keys=True))
    return (f'<h2 id="provenance">Provenance</h2>{_table(["", ""], rows)}'
            f"<details><summary>recipe (recipe.json)</summary><pre>{recipe}</pre></details>")


def rebuild_command(m: dict) -> str:
    """The command line that builds this artifact again, from what the manifest records.

    Not the argv of the run: the page is inside the artifact (its sha256 is in the manifest,
    which is signed), so whatever it shows is part of the artifact's bytes, and argv holds this
    machine's paths (MODEL, OUT, keys, data files) and options that change nothing in the
    artifact (-q, --json, --junit, option order, aliases). The recipe is the complete input,
    so the command is MODEL, OUT and `--recipe recipe.json`: the same for every spelling and
    place, and the bytes of an artifact still depend only on its inputs (bench/artifact_hashes.py)."""
    hub = (m.get("source") or {}).get("hub") or {}
    model = f"{hub['repo_id']} --revision {hub.get('commit')}" if hub.get("repo_id") else "MODEL"
    recipe = m.get("recipe") if isinstance(m.get("recipe"), dict) else {}
    passes = [p.get("name") for p in recipe.get("passes") or [] if isinstance(p, dict)]
    verb = "distill" if "distill" in passes else "quantize"
    return f"tfcompile {verb} {model} -o OUT --recipe recipe.json"  # signing: the row above (--sign KEY)


def recipe_file(recipe):
    """The manifest's recipe ({version, format, passes: [{name, config}]}) as a `--recipe` file
    ({version, format, pipeline, passes: {name: config}}), which builds the same recipe again
    (tests/report/test_report.py rebuilds an artifact from it)."""
    if not isinstance(recipe, dict) or not isinstance(recipe.get("passes"), list):
        return recipe
    steps = [p for p in recipe["passes"] if isinstance(p, dict)]
    out = {"version": recipe.get("version"), "pipeline": [p.get("name") for p in steps],
           "passes": {p.get("name"): p.get("config") or {} for p in steps}}
    if recipe.get("format") not in (None, "custom"):
        out["format"] = recipe["format"]
    return out
