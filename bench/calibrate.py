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

    python bench/calibrate.py [--repeat 3] [--write-docs] [--only speed,memory,gptq]
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
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

FORWARD_SRC = """
import json, sys, time, torch, transformers
from tfcompile.calibration.datasets import calibration_tokens
path, samples, seq_len, batch, seed = sys.argv[1], *map(int, sys.argv[2:6])
model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16).eval()
ids = calibration_tokens("random", None, samples=samples, seq_len=seq_len, seed=seed,
                         vocab=model.config.vocab_size)
t0 = time.perf_counter()
with torch.inference_mode():
    for b in range(0, samples, batch):
        model(input_ids=ids[b: b + batch], use_cache=False)
print(json.dumps({"forward_s": time.perf_counter() - t0}))
"""


def calib_argv(model: Path, out: Path, samples: int = SAMPLES, seq_len: int = SEQ_LEN) -> list[str]:
    return [*tfcompile_argv(), "quantize", "--format", "nvfp4", str(model), "-o", str(out), "--overwrite",
            "--calib", "random", "--calib-samples", str(samples), "--calib-seq-len", str(seq_len), "--json"]


def run_json(argv: list[str], out_json: Path):
    t = run_timed(argv, stdout=out_json)
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
            "hessian": cal.get("hessian_seconds_per_layer", {}), "solve": pack.get("gptq_solve_seconds_per_layer", {}),
            "layer": cal.get("layer_seconds", []), "loop": cal.get("loop"), "rss": t.max_rss_bytes}


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
    ap.add_argument("--write-docs", action="store_true")
    args = ap.parse_args(argv)
    require_gnu_time()
    WORK.mkdir(parents=True, exist_ok=True)
    parts = set(args.only.split(","))
    t0 = time.perf_counter()
    speed = bench_speed(args.repeat, args.wait_idle, args.samples) if "speed" in parts else None
    memory = bench_memory(args.wait_idle) if "memory" in parts else None
    gptq = bench_gptq(args.wait_idle) if "gptq" in parts else None
    body = markdown(speed, memory, gptq, "python bench/calibrate.py " + " ".join(argv or sys.argv[1:]))
    print(body)
    print(f"(bench took {time.perf_counter() - t0:.0f} s)", file=sys.stderr)
    if args.write_docs:
        replace_doc_section(HEADING, body)
    return 0


if __name__ == "__main__":
    sys.exit(main())
