"""Bench: calibration speed and memory (issue #4 acceptance).

1. Speed: a synthetic Llama-shaped checkpoint of ~1.1B parameters (hidden 2048,
   intermediate 8192, 16 layers, vocab 32000; random bf16 weights, generated
   here, not committed). Calibrated NVFP4 (W4A4: `tfcompile quantize --format
   nvfp4 --calib random --calib-samples 64 --calib-seq-len 512`, the whole
   process) against one plain bf16 forward pass of the same model over the
   same 64 x 512 tokens (transformers' model, batches of 4 like calibration,
   timed around the forward only: its load is not counted). Runs alternate;
   medians. Target: at most 1.3x.
2. Memory: peak RSS (/usr/bin/time -v) of the same calibrated quantize on two
   synthetic models that differ only in depth (4 and 16 layers of hidden
   1024): layer-by-layer calibration should keep it flat.
3. GPTQ: the demo LM (examples/demo-lm) with `--algorithm gptq --calib
   python-doc --calib-samples 128 --calib-seq-len 512`: wall time, and per
   decoder layer the seconds spent computing Hessians and solving.

4. Compute dtype (issue 32; its own section, "Calibration: compute dtype by CPU"): per ISA path
   (`--isa native,avx2`; avx2 stands in for an AVX2 machine without native bf16 by
   ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2) F.linear 2048 x 2048 x 5632 and one decoder
   layer of the ~1.1B model (1 x 512 tokens) in float32 and bf16 (`dtype`), and calibrated nvfp4
   with the default `calibrate.dtype=auto` against one float32 transformers load + forward of the
   same tokens, both timed as whole processes (`vsfp32`; `--vs-samples` x 512 tokens). Target
   on an AVX2 machine: at most 2x.

   `repro`: the demo LM's calibrated artifacts of the two paths compared, per calibrate.dtype.

    python bench/calibrate.py [--repeat 3] [--write-docs] [--only speed,memory,gptq,dtype,vsfp32,repro]
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

from common import (  # noqa: E402
    fmt_bytes, git_revision, machine_line, median, replace_doc_section, require_gnu_time, run_timed, wait_idle,
)
from quantize import make_checkpoint, tfcompile_argv  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
WORK = Path("/tmp/tfc-bench-calib")
HEADING = "## Calibration: speed and memory"
SHAPE_1B = dict(hidden=2048, intermediate=8192, heads=32, kv_heads=8, vocab=32000)
SHAPE_MEM = dict(hidden=1024, intermediate=4096, heads=16, kv_heads=4, vocab=32000)
SAMPLES, SEQ_LEN, BATCH, SEED = 64, 512, 4, 0
MAX_RATIO = 1.3

HEADING_DTYPE = "## Calibration: compute dtype by CPU"
# how an AVX2 machine without native bf16 is stood in for here: torch's kernels and oneDNN capped at AVX2
ISA_ENV = {"native": {}, "avx2": {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2"}}
VS_SAMPLES = 8  # vsfp32: 8 x 512 tokens (64 x 512 would take ~20 min per fp32 forward on an AVX2 machine)
MAX_RATIO_FP32 = 2.0

FORWARD_SRC = """
import json, sys, time, torch, transformers
from tfcompile.calibration.datasets import calibration_tokens
path, samples, seq_len, batch, seed = sys.argv[1], *map(int, sys.argv[2:6])
dtype = getattr(torch, sys.argv[6]) if len(sys.argv) > 6 else torch.bfloat16
t_load = time.perf_counter()
model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=dtype).eval()
t_load = time.perf_counter() - t_load
ids = calibration_tokens("random", None, samples=samples, seq_len=seq_len, seed=seed,
                         vocab=model.config.vocab_size)
t0 = time.perf_counter()
with torch.inference_mode():
    for b in range(0, samples, batch):
        model(input_ids=ids[b: b + batch], use_cache=False)
print(json.dumps({"forward_s": time.perf_counter() - t0, "load_s": t_load}))
"""

# F.linear [2048, 2048] x [5632, 2048]^T and one decoder layer of SHAPE_1B on 1 x 512 tokens, per dtype
DTYPE_SRC = """
import tfcompile  # first: drops the checkout root (run from it, its kernels/ shadows HF kernels)
import copy, json, statistics, sys, time, torch, torch.nn.functional as F
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRotaryEmbedding
from tfcompile.machine import compute_dtype
repeat = int(sys.argv[1])
def timed(fn):  # (median wall s, median CPU s of this process): CPU time is what a shared machine spoils least
    fn()  # warm-up: oneDNN builds its kernels on the first call
    ts = []
    for _ in range(repeat):
        t0, c0 = time.perf_counter(), time.process_time(); fn()
        ts.append((time.perf_counter() - t0, time.process_time() - c0))
    return statistics.median(t[0] for t in ts), statistics.median(t[1] for t in ts)
out = {"isa": torch.backends.cpu.get_cpu_capability(), "auto": " ".join(compute_dtype("auto", "BF16")),
       "threads": torch.get_num_threads()}
x32, w32 = torch.randn(2048, 2048), torch.randn(5632, 2048)
cfg = LlamaConfig(hidden_size=2048, intermediate_size=8192, num_attention_heads=32, num_key_value_heads=8)
cfg._attn_implementation = "sdpa"  # as from_pretrained sets it
layer32, h32 = LlamaDecoderLayer(cfg, 0).eval(), torch.randn(1, 512, 2048)
rope, pos = LlamaRotaryEmbedding(cfg), torch.arange(512)[None]
for name, dt in (("float32", torch.float32), ("bfloat16", torch.bfloat16)):
    x, w = x32.to(dt), w32.to(dt)
    wall, cpu = timed(lambda: F.linear(x, w))
    out["linear_" + name], out["linear_cpu_" + name] = 2 * 2048 * 2048 * 5632 / wall / 1e9, cpu  # GFLOP/s, s
    layer, h = copy.deepcopy(layer32).to(dt), h32.to(dt)
    emb = rope(h, pos)
    with torch.inference_mode():
        out["layer_" + name], out["layer_cpu_" + name] = timed(
            lambda: layer(h, position_embeddings=emb, attention_mask=None))  # s
print(json.dumps(out))
"""


def calib_argv(model: Path, out: Path, samples: int = SAMPLES, seq_len: int = SEQ_LEN) -> list[str]:
    return [*tfcompile_argv(), "quantize", "--format", "nvfp4", str(model), "-o", str(out), "--overwrite",
            "--calib", "random", "--calib-samples", str(samples), "--calib-seq-len", str(seq_len), "--json"]


def run_json(argv: list[str], out_json: Path, env: dict | None = None):
    t = run_timed(argv, env=env, stdout=out_json)
    if t.rc != 0:
        sys.exit(f"failed ({t.rc}): {' '.join(argv)}\n{t.stderr_tail}")
    return t, json.loads(out_json.read_text())


def bench_speed(repeat: int, wait: float, samples: int = SAMPLES) -> dict:
    model = make_checkpoint(WORK / "llama-1b", 0, shape=SHAPE_1B, layers=16)
    params = _params(model)
    base, ours, calib_pass, load = [], [], [], []
    for r in range(repeat):
        load.append(wait_idle(wait))
        _, doc = run_json([sys.executable, "-c", FORWARD_SRC, str(model), str(samples), str(SEQ_LEN),
                           str(BATCH), str(SEED)], WORK / "forward.json")
        base.append(doc["forward_s"])
        load.append(wait_idle(wait))
        t, doc = run_json(calib_argv(model, WORK / "out-1b", samples=samples), WORK / "quantize.json")
        ours.append(t.wall_s)
        calib_pass.append(doc["passes"]["calibrate"]["seconds"])
        print(f"  speed run {r + 1}/{repeat}: forward {base[-1]:.1f} s, quantize {ours[-1]:.1f} s "
              f"(calibrate pass {calib_pass[-1]:.1f} s), rss {fmt_bytes(t.max_rss_bytes)}", file=sys.stderr)
    shutil.rmtree(WORK / "out-1b", ignore_errors=True)
    return {"params": params, "forward": base, "quantize": ours, "calibrate_pass": calib_pass, "samples": samples,
            "ratio": median(ours) / median(base), "loop": doc["passes"]["calibrate"].get("loop"),
            "others_cores": max(load)}


def bench_memory(wait: float) -> list[dict]:
    rows = []
    for layers in (4, 16):
        model = make_checkpoint(WORK / f"llama-mem-{layers}", 0, shape=SHAPE_MEM, layers=layers)
        wait_idle(wait)
        t, doc = run_json(calib_argv(model, WORK / "out-mem", samples=16, seq_len=512), WORK / "mem.json")
        rows.append({"layers": layers, "params": _params(model), "rss": t.max_rss_bytes, "wall": t.wall_s,
                     "loop": doc["passes"]["calibrate"].get("loop")})
        print(f"  memory {layers} layers: rss {fmt_bytes(t.max_rss_bytes)}, {t.wall_s:.1f} s", file=sys.stderr)
    shutil.rmtree(WORK / "out-mem", ignore_errors=True)
    return rows


def bench_gptq(wait: float) -> dict:
    wait_idle(wait)
    argv = [*tfcompile_argv(), "quantize", "--format", "nvfp4a16", "--algorithm", "gptq", str(REPO / "examples/demo-lm"),
            "-o", str(WORK / "out-gptq"), "--overwrite", "--calib", "python-doc", "--calib-samples", "128",
            "--calib-seq-len", "512", "--json"]
    t, doc = run_json(argv, WORK / "gptq.json")
    shutil.rmtree(WORK / "out-gptq", ignore_errors=True)
    cal, pack = doc["passes"]["calibrate"], doc["passes"]["pack"]
    return {"wall": t.wall_s, "calibrate": cal["seconds"], "pack": pack["seconds"],
            "hessian": cal.get("hessian_seconds_per_layer", {}), "solve": pack.get("solve_seconds_per_layer", {}),
            "layer": cal.get("layer_seconds", []), "loop": cal.get("loop"), "rss": t.max_rss_bytes}


def _env(isa: str) -> dict:
    import os

    return {**os.environ, **ISA_ENV[isa]}


def _loadavg() -> float:
    import os

    return os.getloadavg()[0]


def bench_dtype(isas: list[str], repeat: int, wait: float) -> list[dict]:
    rows = []
    for isa in isas:
        load = wait_idle(wait)
        t = run_timed([sys.executable, "-c", DTYPE_SRC, str(repeat)], env=_env(isa), stdout=WORK / "dtype.json")
        if t.rc != 0:
            sys.exit(f"forward-dtype bench failed under {isa}:\n{t.stderr_tail}")
        rows.append({"path": isa, "others_cores": load, "loadavg": _loadavg(),
                     **json.loads((WORK / "dtype.json").read_text())})
        print(f"  dtype {isa}: {rows[-1]}", file=sys.stderr)
    return rows


def bench_vs_fp32(isas: list[str], repeat: int, wait: float, samples: int) -> list[dict]:
    """Calibrated nvfp4 (calibrate.dtype auto) vs one float32 load + forward, whole processes, alternating."""
    model = make_checkpoint(WORK / "llama-1b", 0, shape=SHAPE_1B, layers=16)
    rows = []
    for isa in isas:
        base, ours, calib_pass, load, fwd, cpu = [], [], [], [], [], []
        for r in range(repeat):
            load.append(wait_idle(wait))
            t, doc = run_json([sys.executable, "-c", FORWARD_SRC, str(model), str(samples), str(SEQ_LEN), str(BATCH),
                               str(SEED), "float32"], WORK / "forward.json", env=_env(isa))
            base.append(t.wall_s)
            fwd.append(doc["forward_s"])
            cpu_base = t.user_s + t.sys_s
            load.append(wait_idle(wait))
            t, doc = run_json(calib_argv(model, WORK / "out-1b", samples=samples), WORK / "quantize.json", env=_env(isa))
            ours.append(t.wall_s)
            cpu.append((t.user_s + t.sys_s) / cpu_base)
            cal = doc["passes"]["calibrate"]
            calib_pass.append(cal["seconds"])
            print(f"  vsfp32 {isa} {r + 1}/{repeat}: fp32 load+forward {base[-1]:.1f} s (forward {fwd[-1]:.1f}), "
                  f"quantize {ours[-1]:.1f} s (calibrate {calib_pass[-1]:.1f} s, {cal.get('compute_dtype')})",
                  file=sys.stderr)
        rows.append({"path": isa, "samples": samples, "baseline": base, "forward": fwd, "quantize": ours,
                     "calibrate_pass": calib_pass, "compute_dtype": cal.get("compute_dtype"),
                     "why": cal.get("compute_dtype_why"), "ratio": median(ours) / median(base),
                     "cpu_ratio": median(cpu), "loadavg": _loadavg(),
                     "others_cores": max(load)})
    shutil.rmtree(WORK / "out-1b", ignore_errors=True)
    return rows


# repro: the demo LM calibrated on both ISA paths, with auto and with one dtype forced on both
REPRO_RUNS = {"nvfp4": ["--format", "nvfp4"], "nvfp4a16 gptq": ["--format", "nvfp4a16", "--algorithm", "gptq"]}
REPRO_PAIRS = (("auto", "auto"), ("float32", "float32"), ("bfloat16", "bfloat16"))


def bench_repro() -> list[dict]:
    """How far apart the artifacts of the native and the avx2 path are: per pair of calibrate.dtype
    settings, the largest relative difference of an input_global_scale and the share of weight and
    weight-scale bytes that differ (demo LM, python-doc, 16 x 256 tokens)."""
    import torch  # lazy: only this part reads tensors here
    from safetensors.torch import load_file

    rows = []
    for name, fmt in REPRO_RUNS.items():
        got = {}
        for isa, dtype in {(i, d) for pair in REPRO_PAIRS for i, d in zip(ISA_ENV, pair)}:
            out = WORK / f"repro-{isa}-{dtype}"
            argv = [*tfcompile_argv(), "quantize", str(REPO / "examples/demo-lm"), "-o", str(out), "--overwrite",
                    *fmt, "--calib", "python-doc", "--calib-samples", "16", "--calib-seq-len", "256",
                    "--set", f"calibrate.dtype={dtype}", "--json"]
            _, doc = run_json(argv, WORK / "repro.json", env=_env(isa))
            got[isa, dtype] = (load_file(str(out / "model.safetensors")), doc["passes"]["calibrate"]["compute_dtype"])
            shutil.rmtree(out)
        for a, b in REPRO_PAIRS:
            (ta, da), (tb, db) = got["native", a], got["avx2", b]
            igs = [k for k in ta if k.endswith("input_global_scale")]
            wk = [k for k in ta if k.endswith(("weight_packed", "weight_scale"))]
            rows.append({"run": name, "setting": a, "native": da, "avx2": db,
                         "igs_rel": max((abs(float(ta[k]) / float(tb[k]) - 1) for k in igs), default=None),
                         "weight_bytes_differ": sum(int((ta[k].view(-1).view(torch.uint8) != tb[k].view(-1).view(
                             torch.uint8)).sum()) for k in wk) / sum(ta[k].numel() * ta[k].element_size() for k in wk)})
            print(f"  repro {rows[-1]}", file=sys.stderr)
    return rows


def markdown_dtype(dtype_rows: list | None, vs_rows: list | None, cmd: str, repro: list | None = None) -> str:
    out = [f"Command: `{cmd}`\n", f"Machine: {machine_line()}. Code: `{git_revision()}`. Path `avx2`: this "
           f"machine with ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 (**emulation** of an AVX2 CPU without "
           f"native bf16: its kernels, this machine's cores and memory); `native`: as it is.\n"]
    if dtype_rows:
        out += ["**Forward dtype.** F.linear 2048 x 2048 x 5632 and one decoder layer of the ~1.1B model below "
                "(hidden 2048, intermediate 8192, 32/8 heads) on 1 x 512 tokens, 2 threads, medians. Each as wall "
                "time and as CPU time (the process's user + sys seconds), which other jobs on a shared machine "
                "distort less: GFLOP/s of wall, GFLOP per CPU second; `auto`: what `calibrate.dtype=auto` picks "
                "there for a bf16 checkpoint.\n",
                "| path | torch ISA | F.linear fp32 (wall, CPU) | F.linear bf16 (wall, CPU) | bf16 speed-up (wall, CPU) | "
                "layer fp32 (wall, CPU s) | layer bf16 (wall, CPU s) | bf16 speed-up (wall, CPU) | auto | other load |",
                "|---|---|---:|---:|---:|---:|---:|---:|---|---:|"]
        flop = 2 * 2048 * 2048 * 5632 / 1e9
        out += [f"| {r['path']} | {r['isa']} | {r['linear_float32']:.1f}, {flop / r['linear_cpu_float32']:.0f} | "
                f"{r['linear_bfloat16']:.1f}, {flop / r['linear_cpu_bfloat16']:.0f} | "
                f"{r['linear_bfloat16'] / r['linear_float32']:.2f}x, "
                f"{r['linear_cpu_float32'] / r['linear_cpu_bfloat16']:.2f}x | {r['layer_float32']:.2f}, "
                f"{r['layer_cpu_float32']:.2f} | {r['layer_bfloat16']:.2f}, {r['layer_cpu_bfloat16']:.2f} | "
                f"{r['layer_float32'] / r['layer_bfloat16']:.2f}x, {r['layer_cpu_float32'] / r['layer_cpu_bfloat16']:.2f}x"
                f" | {r['auto']} | {r['others_cores']:.1f} cores, load avg {r.get('loadavg', 0):.1f} |"
                for r in dtype_rows]
        out.append("")
    if vs_rows:
        out += [f"**Calibrated run vs one float32 forward** (target on an AVX2 machine <= {MAX_RATIO_FP32}x). "
                "Synthetic Llama of ~1.1B parameters (as in the section above), `tfcompile quantize --format nvfp4 "
                "--calib random` with the default `calibrate.dtype=auto`, against one float32 transformers "
                "`from_pretrained` + forward of the same tokens (batches of 4); both whole processes, alternating, "
                "medians; CPU ratio: user + sys seconds of the quantize process over the baseline's.\n",
                "| path | tokens | forwards in | fp32 load + forward | of it forward | quantize | "
                "of it calibrate | ratio | CPU ratio | other load |", "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|"]
        out += [f"| {r['path']} | {r['samples']} x {SEQ_LEN} | {r['compute_dtype']} ({r['why']}) | "
                f"{median(r['baseline']):.1f} s | {median(r['forward']):.1f} s | {median(r['quantize']):.1f} s | "
                f"{median(r['calibrate_pass']):.1f} s | **{r['ratio']:.2f}x** | {r['cpu_ratio']:.2f}x | "
                f"{r['others_cores']:.1f} cores, load avg {r.get('loadavg', 0):.1f} |"
                for r in vs_rows]
        out.append("")
    if repro:
        out += ["**Across the two paths** (demo LM, python-doc 16 x 256 calibration tokens): the artifact of the "
                "native path against the avx2 path's with the same `calibrate.dtype` on both.\n",
                "| run | calibrate.dtype | forwards (native, avx2) | input_global_scale max rel. difference | "
                "weight + weight-scale bytes that differ |", "|---|---|---|---:|---:|"]
        out += [f"| {r['run']} | {r['setting']} | {r['native']}, {r['avx2']} | "
                f"{'-' if r['igs_rel'] is None else format(r['igs_rel'], '.1e')} | "
                f"{100 * r['weight_bytes_differ']:.3f}% |" for r in repro]
        out.append("")
    return "\n".join(out)


def _params(model: Path) -> int:
    idx = json.loads((model / "model.safetensors.index.json").read_text())
    return idx["metadata"]["total_size"] // 2  # bf16


def markdown(speed: dict | None, memory: list | None, gptq: dict | None, cmd: str) -> str:
    out = [f"Command: `{cmd}`\n", f"Machine: {machine_line()}. Code: `{git_revision()}`.\n"]
    if speed:
        ok = "met" if speed["ratio"] <= MAX_RATIO else "MISSED"
        out += [f"**Speed** (target <= {MAX_RATIO}x). Model: synthetic Llama, {speed['params'] / 1e9:.2f} B parameters "
                f"(hidden 2048, intermediate 8192, 16 layers, vocab 32000), random bf16; {speed['samples']} x {SEQ_LEN} "
                f"tokens in batches of {BATCH}; calibration loop: {speed['loop']}; other processes used up to "
                f"{speed['others_cores']:.1f} cores just before a run.\n",
                "| run | median | runs |", "|---|---:|---|",
                f"| plain bf16 forward (transformers, forward only) | {median(speed['forward']):.1f} s | "
                f"{', '.join(f'{x:.1f}' for x in speed['forward'])} |",
                f"| `tfcompile quantize --format nvfp4` (whole process) | {median(speed['quantize']):.1f} s | "
                f"{', '.join(f'{x:.1f}' for x in speed['quantize'])} |",
                f"| of which the calibrate pass | {median(speed['calibrate_pass']):.1f} s | "
                f"{', '.join(f'{x:.1f}' for x in speed['calibrate_pass'])} |",
                f"\nRatio: **{speed['ratio']:.2f}x** of one plain forward ({ok}).\n"]
    if memory:
        out += ["**Memory**: peak RSS of the same calibrated nvfp4 quantize (16 x 512 tokens) on two models that "
                "differ only in depth (hidden 1024, intermediate 4096, vocab 32000).\n",
                "| layers | parameters | peak RSS | wall | loop |", "|---:|---:|---:|---:|---|"]
        out += [f"| {r['layers']} | {r['params'] / 1e6:.0f} M | {fmt_bytes(r['rss'])} | {r['wall']:.1f} s | {r['loop']} |"
                for r in memory]
        out.append("")
    if gptq:
        out += [f"**GPTQ** on the demo LM (nvfp4a16, python-doc calib split, 128 x 512 tokens): "
                f"{gptq['wall']:.1f} s wall in all (calibrate pass {gptq['calibrate']:.1f} s, pack with the GPTQ "
                f"solves {gptq['pack']:.1f} s), peak RSS {fmt_bytes(gptq['rss'])}; loop: {gptq['loop']}.\n",
                "| decoder layer | layer forward (s) | Hessians (s) | GPTQ solve (s) |", "|---:|---:|---:|---:|"]
        for i, key in enumerate(sorted(set(gptq["hessian"]) | set(gptq["solve"]), key=lambda k: (not k.isdigit(), k.zfill(6)))):
            fwd = gptq["layer"][int(key)] if key.isdigit() and int(key) < len(gptq["layer"]) else float("nan")
            out.append(f"| {key} | {fwd:.2f} | {gptq['hessian'].get(key, 0.0):.2f} | {gptq['solve'].get(key, 0.0):.2f} |")
        out.append("\nOne Hessian per fusion group (q/k/v share one, gate/up share one); its time is "
                   "spent inside the layer forward (the layer-forward column includes it).\n")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--wait-idle", type=float, default=60.0)
    ap.add_argument("--only", default="speed,memory,gptq")
    ap.add_argument("--samples", type=int, default=SAMPLES, help="calibration sequences for the speed part")
    ap.add_argument("--isa", default="native,avx2", help="dtype/vsfp32: ISA paths (native, avx2)")
    ap.add_argument("--vs-samples", type=int, default=VS_SAMPLES, help="vsfp32: calibration sequences")
    ap.add_argument("--write-docs", action="store_true")
    args = ap.parse_args(argv)
    require_gnu_time()
    WORK.mkdir(parents=True, exist_ok=True)
    parts = set(args.only.split(","))
    t0 = time.perf_counter()
    speed = bench_speed(args.repeat, args.wait_idle, args.samples) if "speed" in parts else None
    memory = bench_memory(args.wait_idle) if "memory" in parts else None
    gptq = bench_gptq(args.wait_idle) if "gptq" in parts else None
    isas = args.isa.split(",")
    dtype = bench_dtype(isas, args.repeat, args.wait_idle) if "dtype" in parts else None
    vs = bench_vs_fp32(isas, args.repeat, args.wait_idle, args.vs_samples) if "vsfp32" in parts else None
    repro = bench_repro() if "repro" in parts else None
    cmd = "python bench/calibrate.py " + " ".join(argv or sys.argv[1:])
    body = markdown(speed, memory, gptq, cmd) if speed or memory or gptq else ""
    body_dtype = markdown_dtype(dtype, vs, cmd, repro) if dtype or vs or repro else ""
    print(body + body_dtype)
    print(f"(bench took {time.perf_counter() - t0:.0f} s)", file=sys.stderr)
    if args.write_docs and body:
        replace_doc_section(HEADING, body)
    if args.write_docs and body_dtype:
        replace_doc_section(HEADING_DTYPE, body_dtype)
    return 0


if __name__ == "__main__":
    sys.exit(main())
