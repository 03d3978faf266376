"""Bench: `tfcompile plan --estimate` against measured runs (issue #17: within 30%).

    python bench/estimate.py --measure          # microbenchmarks -> THIS_MACHINE (tfcompile/estimate/throughputs.py)
    python bench/estimate.py [--repeat 3] [--committed] [--write-docs]

--measure times the primitives the estimator is built from, each on its own (one bf16 layer
GEMM, one fp32 X^T X, SDPA, a layer's norms/RoPE/activation/observers, whole RTN packs of a
0.25 and a 0.62 GB model (fixed cost + rate), sha256, a cold read, the GPTQ factorisations,
lazy update and column sweep, an idle process's RSS) and prints the dict to paste into THIS_MACHINE (its
"gptq_sweep" into passes/quantize/gptq_cost.py SWEEP, the algorithm's own figures). Without --committed the
comparison measures them first and hands them to `plan` (TFCOMPILE_THROUGHPUTS), so the
estimate and the runs see the same load on this shared machine.

The comparison builds the synthetic 1.1B Llama of bench/calibrate.py (hidden 2048,
intermediate 8192, 16 layers; random bf16 weights, not committed) and, for each recipe, runs
`tfcompile quantize ... --json` (median of --repeat runs, the source hash cache off so each
run hashes as a first run does: pass seconds from the pass stats,
peak RSS from GNU time, tensor bytes from the manifest) next to `tfcompile plan --estimate
--json` for the same recipe on this machine (`--devices cpu`). Recipes: nvfp4a16 RTN (the
pack pass), nvfp4 calibrated on 8 x 256 random tokens (the calibrate pass), and nvfp4a16 GPTQ
on a 2-layer model of the same widths (the solves). A figure passes within 30%; the output
size must be exact.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

from common import git_revision, machine_line, median, replace_doc_section, require_gnu_time, run_timed, wait_idle  # noqa: E402
from quantize import make_checkpoint, tfcompile_argv  # noqa: E402

WORK = Path("/tmp/tfc-bench-estimate")
THROUGHPUTS = WORK / "throughputs.json"  # this session's --measure (TFCOMPILE_THROUGHPUTS for plan)
HEADING = "## Resource estimates: plan --estimate vs measured"
SHAPE_1B = dict(hidden=2048, intermediate=8192, heads=32, kv_heads=8, vocab=32000)
CALIB = ["--calib", "random", "--calib-samples", "8", "--calib-seq-len", "256"]
RECIPES = {  # name -> (layers, quantize options, pass compared)
    "rtn": (16, ["--format", "nvfp4a16"], "pack"),
    "calibrated": (16, ["--format", "nvfp4", *CALIB], "calibrate"),
    "gptq": (2, ["--format", "nvfp4a16", "--algorithm", "gptq", *CALIB], "pack"),
}
TOLERANCE = 0.30


def _scale_search_ns(timed, g) -> float:
    """quantize.scale_search=output, one thread: ns per weight to score one candidate rounding of an
    NVFP4 [2048, 2048] weight (its 4 block-scale codes in the search kernel: output_scales.py)."""
    import torch

    from tfcompile.kernels import formats as F
    from tfcompile.passes.quantize import output_scales as S

    w = torch.randn(2048, 2048, generator=g).bfloat16()
    x = torch.randn(4096, 2048, generator=g)
    a = S.tri(S.diag_blocks(x.T @ x / 4096, 16))
    gs = torch.tensor([2688.0]) / w.float().abs().max()

    def one():
        with F.kernel_threads(1):
            S.nvfp4_search(w, gs, a)
    return timed(one, 3) / w.numel() * 1e9


def measure() -> dict:
    """The primitives, medians of 5 (see the module docstring)."""
    import hashlib
    import os

    import torch


    from formats import median_s

    def timed(fn, n=5):
        return median_s(fn, n)

    g = torch.Generator().manual_seed(0)
    x = torch.randn(2048, 2048, generator=g).bfloat16()
    w = torch.randn(8192, 2048, generator=g).bfloat16()
    out = {"cpu_cores": os.cpu_count()}
    out["bf16_gemm_gflops"] = 2 * 2048 * 2048 * 8192 / timed(lambda: x @ w.T) / 1e9
    xf = x.float()
    out["fp32_gemm_gflops"] = 2 * 2048 ** 3 / timed(lambda: xf.T @ xf) / 1e9
    q = torch.randn(4, 32, 256, 64, generator=g).bfloat16()
    sdpa = torch.nn.functional.scaled_dot_product_attention
    out["attn_gflops"] = 4 * 4 * 32 * 256 * 256 * 64 / timed(lambda: sdpa(q, q, q, is_causal=True)) / 1e9
    out["elementwise_ns"] = _elementwise(timed)
    blob = os.urandom(256 << 20)
    f = WORK / "read.bin"
    f.parent.mkdir(parents=True, exist_ok=True)
    f.write_bytes(blob)

    def cold_read():
        fd = os.open(f, os.O_RDONLY)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        while os.read(fd, 8 << 20):
            pass
        os.close(fd)

    out["read_gbps"] = len(blob) / timed(cold_read, 3) / 1e9
    out["sha256_gbps"] = len(blob) / timed(lambda: hashlib.sha256(blob).digest(), 3) / 1e9
    out["pack_setup_s"], out["pack_gbps"] = _pack_rate()
    out["calibrate_setup_s"], out["calibrate_rss_gb"] = _calibrate_setup()
    torch.set_num_threads(1)
    hk = torch.randn(2048, 2048, generator=g)
    hk = hk @ hk.T / 2048 + torch.eye(2048)
    out["chol_gflops"] = 4 / 3 * 2048 ** 3 / timed(
        lambda: torch.linalg.cholesky(torch.cholesky_inverse(torch.linalg.cholesky(hk)), upper=True), 3) / 1e9
    out["gptq_sweep"] = _gptq_sweep(timed, g)
    out["scale_search_ns"] = _scale_search_ns(timed, g)
    t = run_timed([sys.executable, "-c", "import torch, transformers, tfcompile.cli.main, tfcompile.passes.builtin"])
    out["base_rss_gb"] = t.max_rss_bytes / 1e9
    return {k: (round(v, 3) if isinstance(v, float) else v) for k, v in out.items()}


def _gptq_sweep(timed, g) -> dict:
    """One thread, the GPTQ sweep without its factorisations, fitted as K a + n K b + n K^2 c on
    three shapes (n rows, K columns) unlike the compared run's: a per column, b per element,
    c for the lazy updates and strided column reads that grow with K."""
    import torch

    from tfcompile.kernels.formats.quantizer import weight_quantizer
    from tfcompile.passes.quantize.gptq import _inverse_hessian, gptq_values

    grid = weight_quantizer("nvfp4")  # the E2M1 grid
    rows, ts = [], []
    for n, k in ((1024, 1024), (1024, 4096), (4096, 1024)):
        x = torch.randn(2 * k, k, generator=g)
        h, w, m = x.T @ x / (2 * k), torch.randn(n, k, generator=g) * 0.02, torch.full((n, k), 2e-3)
        total = timed(lambda: gptq_values(w, h, m, grid), 1)
        ts.append(total - timed(lambda: _inverse_hessian(h[None], w[None].clone(), 0.01), 1))
        rows.append([k, n * k, n * k * k])
    a, b, c = torch.linalg.solve(torch.tensor(rows, dtype=torch.float64), torch.tensor(ts, dtype=torch.float64)).tolist()
    return {"column_us": a * 1e6, "element_ns": b * 1e9, "lazy_ps": c * 1e12}


def _pack_rate() -> tuple[float, float]:
    """(fixed seconds, GB of bf16 source per second) of a whole RTN `tfcompile quantize`'s pack
    pass (quantize, write, hash; the source hash cache off), as processes and threads run it,
    fitted as fixed + bytes / rate on two small models (4 and 16 layers of hidden 1024: 0.25 and
    0.62 GB), medians of 3 each. One rate from one small model (the previous way) spread the
    pass's fixed cost (thread pools, writer, files) over its bytes: 0.45 GB/s where a 2.2 GB
    model streams at 0.7."""
    points = []
    for layers in (4, 16):
        model = make_checkpoint(WORK / f"llama-small-{layers}", 0, shape=dict(hidden=1024, intermediate=4096,
                                                                               heads=16, kv_heads=4, vocab=32000),
                                layers=layers)
        secs = []
        for _ in range(3):
            doc = WORK / "small.json"
            t = run_timed([*tfcompile_argv(), "quantize", str(model), "-o", str(WORK / "out-small"), "--overwrite",
                           "--format", "nvfp4a16", "--set", "pack.hash_cache=false", "--json", "-q"], stdout=doc)
            if t.rc:
                sys.exit(t.stderr_tail)
            d = json.loads(doc.read_text())["passes"]["pack"]
            secs.append(d["seconds"])
        points.append((d["bytes_in"] / 1e9, statistics.median(secs)))
    (g0, s0), (g1, s1) = points
    per_gb = max((s1 - s0) / (g1 - g0), 1e-3)
    return max(s0 - g0 * per_gb, 0.0), 1 / per_gb


SETUP_SRC = """
import json, sys, time, torch
import tfcompile.passes.builtin  # what a run has imported before its calibrate pass
from tfcompile.calibration.sequential import observe_sequential
from tfcompile.io.checkpoint import open_checkpoint
t0 = time.perf_counter()
observe_sequential(sys.argv[1], open_checkpoint(sys.argv[1]), set(), data="random", samples=1, seq_len=8, seed=0,
                   dtype=torch.bfloat16)
print(json.dumps(time.perf_counter() - t0))
"""


def _calibrate_setup() -> tuple[float, float]:
    """The layer loop's fixed cost as a run's calibrate pass pays it (transformers imported, the
    model built on the meta device, tokens, hooks): one token through a 4-layer model of hidden
    1024, in a fresh process; and that process's peak RSS (the calibrate pass's baseline).
    Medians of 3."""
    secs, rss = [], []
    for _ in range(3):
        out = WORK / "setup.json"
        t = run_timed([sys.executable, "-c", SETUP_SRC, str(WORK / "llama-small-4")], stdout=out)
        if t.rc:
            sys.exit(t.stderr_tail)
        secs.append(float(out.read_text()))
        rss.append(t.max_rss_bytes / 1e9)
    return statistics.median(secs), statistics.median(rss)


def _elementwise(timed) -> float:
    """A decoder layer's calibration work besides its GEMMs and attention, timed on its own
    (1.1B widths, 4 x 256 tokens, bf16, transformers' own norm and RoPE): two RMSNorms, RoPE of
    q and k, SiLU(gate) * up, two residual adds, the attention output's transpose, and the max
    observer of each of the 7 Linears (|x|.amax of its input); in ns per token per
    (4 x hidden + 3 x intermediate) elements, the unit plan.py scales by. Timed directly: as the
    residue of a whole layer minus its GEMMs (the previous way) it carried both timings' noise."""
    import torch
    import torch.nn.functional as F
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRMSNorm, LlamaRotaryEmbedding, apply_rotary_pos_emb

    b, n, h, i, heads, kv, d = 4, 256, 2048, 8192, 32, 8, 64
    cfg = LlamaConfig(hidden_size=h, intermediate_size=i, num_attention_heads=heads, num_key_value_heads=kv)
    g = torch.Generator().manual_seed(1)

    def rnd(*shape):
        return torch.randn(*shape, generator=g).bfloat16()

    x, q, k, attn, gate, up = rnd(b, n, h), rnd(b, heads, n, d), rnd(b, kv, n, d), rnd(b, heads, n, d), \
        rnd(b, n, i), rnd(b, n, i)
    norm1, norm2 = LlamaRMSNorm(h).bfloat16(), LlamaRMSNorm(h).bfloat16()
    cos, sin = LlamaRotaryEmbedding(cfg)(x, torch.arange(n)[None].expand(b, -1))

    def observe(t, times):
        for _ in range(times):
            float(t.abs().amax().float())

    def layer_rest():
        y = norm1(x)
        observe(y, 3)  # q, k, v
        apply_rotary_pos_emb(q, k, cos, sin)
        a = attn.transpose(1, 2).contiguous().reshape(b, n, -1)
        observe(a, 1)  # o
        r = x + a
        y = norm2(r)
        observe(y, 2)  # gate, up
        act = F.silu(gate) * up
        observe(act, 1)  # down
        return r + y

    with torch.inference_mode():
        t = timed(layer_rest)
    return t / (b * n * (4 * h + 3 * i)) * 1e9


def _runs(name: str, repeat: int, wait: float) -> dict:
    layers, opts, pass_name = RECIPES[name]
    model = make_checkpoint(WORK / f"llama-1b-{layers}", 0, shape=SHAPE_1B, layers=layers)
    est_json = WORK / f"{name}-estimate.json"
    env = dict(os.environ, **({"TFCOMPILE_THROUGHPUTS": str(THROUGHPUTS)} if THROUGHPUTS.exists() else {}))
    t = run_timed([*tfcompile_argv(), "plan", str(model), *opts, "--estimate", "--json"], stdout=est_json, env=env)
    if t.rc:
        sys.exit(f"plan --estimate failed: {t.stderr_tail}")
    est = json.loads(est_json.read_text())
    seconds, rss, busy = [], [], []
    for _ in range(repeat):
        busy.append(wait_idle(wait))
        out_json = WORK / f"{name}-run.json"
        run = run_timed([*tfcompile_argv(), "quantize", str(model), "-o", str(WORK / f"out-{name}"), "--overwrite",
                         *opts, "--set", "pack.hash_cache=false", "--json", "-q"], stdout=out_json)
        if run.rc:
            sys.exit(f"quantize failed: {run.stderr_tail}")
        doc = json.loads(out_json.read_text())
        seconds.append(doc["passes"][pass_name]["seconds"])
        rss.append(run.max_rss_bytes / 1e9)
    measured = {"seconds": median(seconds), "rss_gb": median(rss), "output_bytes": doc["summary"]["bytes_out"]}
    predicted = {"seconds": est["passes"][pass_name]["seconds"], "rss_gb": est["memory"]["host_gb_per_rank"],
                 "output_bytes": est["output_bytes"]}
    ratio = {k: predicted[k] / measured[k] for k in ("seconds", "rss_gb")}
    return {"recipe": name, "layers": layers, "options": opts, "pass": pass_name, "measured": measured,
            "estimate": predicted, "ratio": {k: round(v, 3) for k, v in ratio.items()},
            "runs_seconds": seconds, "busy_cores": busy,
            "ok": predicted["output_bytes"] == measured["output_bytes"]
            and all(abs(v - 1) <= TOLERANCE for v in ratio.values())}


def _markdown(results: list[dict]) -> str:
    lines = [f"`python bench/estimate.py --write-docs` ({machine_line()}, commit {git_revision()}): "
             "`tfcompile plan MODEL ... --estimate --devices cpu` next to the measured `tfcompile quantize` of the "
             "same recipe on the synthetic 1.1B Llama (hidden 2048, intermediate 8192; 16 layers, GPTQ on 2), "
             "medians of the runs. The estimates use throughputs measured by microbenchmarks minutes before "
             "(`--measure`: a layer's GEMM, attention and its other ops timed on their own, two small models' "
             "packs (fixed cost + rate), one factorisation, ...; THIS_MACHINE in "
             "tfcompile/estimate/throughputs.py holds a set of them), never these runs.", "",
             "| recipe | pass | measured s | estimated s | ratio | peak RSS GB | estimated GB | ratio | "
             "output bytes (measured = estimated) | within 30% |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        m, e = r["measured"], r["estimate"]
        lines.append(f"| {r['recipe']} | {r['pass']} | {m['seconds']:.1f} | {e['seconds']:.1f} | {r['ratio']['seconds']:.2f} "
                     f"| {m['rss_gb']:.2f} | {e['rss_gb']:.2f} | {r['ratio']['rss_gb']:.2f} | {m['output_bytes']:,} "
                     f"({'=' if m['output_bytes'] == e['output_bytes'] else '!='}) | {'yes' if r['ok'] else 'NO'} |")
    busy = [b for r in results for b in r["busy_cores"]]
    lines += ["", f"Other load on the machine during the runs: {min(busy):.1f}-{max(busy):.1f} busy cores "
              "(of 2); the throughputs were measured under similar load."]
    return "\n".join(lines) + "\n"


PLANS_HEADING = "## Estimates for large models"
PLANS = [  # (config, options)
    ("deepseek-v3", ["--format", "nvfp4a16"]),
    ("deepseek-v3", ["--format", "nvfp4", "--calib-samples", "512", "--calib-seq-len", "2048"]),
    ("deepseek-v3", ["--format", "nvfp4a16", "--algorithm", "gptq", "--calib-samples", "512", "--calib-seq-len", "2048"]),
    ("llama-3.1-405b", ["--format", "nvfp4a16", "--algorithm", "gptq", "--calib-samples", "512", "--calib-seq-len", "2048"]),
    ("llama-3.1-8b", ["--format", "nvfp4a16", "--algorithm", "gptq", "--calib-samples", "512", "--calib-seq-len", "2048"]),
]
CLUSTERS = [("8xH200", 1), ("8xH200", 4), ("8xB200", 1)]


def plans_markdown() -> str:
    """`plan --estimate` on the committed example configs: docs/distributed.md's table."""
    configs = Path(__file__).resolve().parents[1] / "examples" / "configs"
    WORK.mkdir(parents=True, exist_ok=True)
    rows = ["| model | recipe | cluster | output GB | host GB/rank | device GB/rank | Hessian spill GB/rank | "
            "calibrate | pack | total |", "|---|---|---|---|---|---|---|---|---|---|"]
    for name, opts in PLANS:
        for devices, nodes in CLUSTERS:
            path = WORK / "plan.json"
            t = run_timed([*tfcompile_argv(), "plan", str(configs / name), *opts, "--estimate", "--devices", devices,
                           "--nodes", str(nodes), "--json"], stdout=path)
            if t.rc:
                sys.exit(t.stderr_tail)
            d = json.loads(path.read_text())
            p, m = d["passes"], d["memory"]
            recipe = " ".join(o for o in opts if not o.startswith("--")).replace("512 2048", "512x2048 tokens")
            calib = f"{p['calibrate']['seconds'] / 60:.1f} min" if "calibrate" in p else "-"
            rows.append(f"| {name} | {recipe} | {nodes} x {devices} | {d['output_gb']:.1f} | {m['host_gb_per_rank']:.1f} "
                        f"| {m['device_gb_per_rank']:.1f} | {d['disk']['hessian_spill_gb_per_rank']:.1f} | {calib} | "
                        f"{p['pack']['seconds'] / 60:.1f} min | {d['total_s'] / 60:.1f} min |")
    return "\n".join([f"`python bench/estimate.py --plans --write-docs` (commit {git_revision()}); GB = 1e9 "
                      "bytes. DeepSeek-V3's source is its published FP8 checkpoint (config.json's quantization_config: "
                      "read at 1 byte per weight); tfcompile reads bf16 sources today, i.e. after DeepSeek's "
                      "fp8_cast_bf16.py (1.34 TB: twice the reading). "
                      "Calibration in batches of 4; GPTQ solves every Linear group, each routed expert with its own "
                      "Hessians (in batches of 8 experts, each batch owned by one rank: passes/quantize/gptq_moe.py); `--calib self` would add "
                      "sampling the tokens. Times under 2 minutes are rounded to 0.1 min each, so a total may "
                      "differ from its parts by 0.1. The W4A4 `nvfp4` rows' pack is almost all the output-scale "
                      "search (`scale_search_s`, W4A4 NVFP4 RTN's default since 2026-12-05): each quantized weight "
                      "scored under six candidate roundings at `scale_search_ns` each, a group's six candidates on "
                      "six of the rank's host cores (at the efficiency measured for two), against 0.6 min of "
                      "streaming; `--set quantize.scale_search=none` gives max-based scales without it "
                      "(docs/performance.md \"Issue 32: the output-scale search as a kernel\").", "", *rows, ""])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--measure", action="store_true", help="only measure the throughputs and print them")
    ap.add_argument("--committed", action="store_true", help="estimate with the committed THIS_MACHINE "
                    "figures instead of measuring them first")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--wait", type=float, default=30.0, help="seconds to wait for an idle machine per run")
    ap.add_argument("--only", default=",".join(RECIPES))
    ap.add_argument("--write-docs", action="store_true")
    ap.add_argument("--plans", action="store_true", help="only the large-model table of docs/distributed.md")
    args = ap.parse_args()
    if args.plans:
        body = plans_markdown()
        print(body)
        if args.write_docs:
            print(replace_doc_section(PLANS_HEADING, body, Path(__file__).resolve().parents[1] / "docs" / "distributed.md"),
                  file=sys.stderr)
        return
    require_gnu_time()
    if args.measure or not args.committed:
        rates = measure()
        THROUGHPUTS.write_text(json.dumps(rates, indent=2))
        print(json.dumps(rates, indent=2))
        if args.measure:
            return
    else:
        THROUGHPUTS.unlink(missing_ok=True)
    results = [_runs(n, args.repeat, args.wait) for n in args.only.split(",")]
    print(json.dumps(results, indent=2))
    (WORK / "results.json").write_text(json.dumps(results, indent=2))
    if args.write_docs:
        print(replace_doc_section(HEADING, _markdown(results)), file=sys.stderr)
    if not all(r["ok"] for r in results):
        sys.exit(1)


if __name__ == "__main__":
    main()
