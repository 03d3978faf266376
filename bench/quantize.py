"""Bench: stream a large synthetic Llama checkpoint through `tfcompile quantize`.

Acceptance criterion (streaming and speed): a synthetic Llama-shaped
checkpoint of at least 4 GB, quantized to nvfp4a16 and to fp8-dynamic, must
  * keep peak RSS (GNU `/usr/bin/time -v`, "Maximum resident set size") under
    1.5 GB + the largest tensor's bytes, and
  * take at most 2x the wall time of a baseline measured in the same run:
    `python -c "import torch"` plus a plain read of the same safetensors files.

Usage:
    python bench/quantize.py                       # make the model if missing, bench, print a table
    python bench/quantize.py --write-docs          # ... and update docs/performance.md
    python bench/quantize.py --make DIR --size-gb 4.2   # only write the synthetic checkpoint
    python bench/quantize.py --baseline-only       # only the baseline (no tfcompile run)
    python bench/quantize.py --profile             # + one cProfile'd nvfp4a16 run, top functions

Baseline (one process, so one interpreter start, which makes it slightly
*stricter* than two): `python -c "import torch; <read loop>"` where the read
loop opens every *.safetensors file of the model unbuffered and `readinto`s
it front to back into one reused 16 MiB bytearray. Before the first timed run
every file is read once untimed, so both the baseline and tfcompile find the
source in the page cache (the machine must have RAM for the model; checked).

tfcompile: `tfcompile quantize --format F MODEL -o OUT --overwrite -q`, the
installed console script, a fresh process per run. OUT is deleted (and
`sync` run) between runs, outside the timing, so no run pays for deleting or
flushing the previous one; each run still pays its own fsyncs. Before each
timed run the bench waits (--wait-idle, up to 300 s) until other processes
use < 0.2 cores (from /proc/stat): on a shared machine a concurrent test suite
inflates wall times several fold. The load seen is reported per format, and a
format whose runs could not wait out the load is flagged CONTENDED. Runs alternate
baseline, tfcompile, baseline, tfcompile, ... per format. The first tfcompile
run of each format starts from an empty TFCOMPILE_CACHE (pointed into the work
dir: the fused-kernel build and the source sha256 cache), so it includes the
one-time C kernel build and hashing the sources: it is shown separately as
"cold"; medians are over all runs.

The synthetic checkpoint is written once (about 20 s for 4.2 GB) and reused
when its stamp matches; --clean deletes it at the end.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import shutil
import struct
import subprocess
import sys
import time
from pathlib import Path

from common import (  # noqa: E402 - bench scripts run as files, not as a package
    Timed,
    disk_free,
    fmt_bytes,
    machine_description,
    machine_line,
    median,
    cpu_scaling,
    git_revision,
    replace_doc_section,
    require_gnu_time,
    run_timed,
    wait_idle,
)

DOC_HEADING = "## Quantize: streaming a large checkpoint"
DEFAULT_WORK = Path("/tmp/tfc-bench")
DEFAULT_FORMATS = ("nvfp4a16", "fp8-dynamic")
RSS_BASE = 1.5e9  # bytes: "1.5 GB" in the criterion, read as decimal GB (the stricter reading)
MAX_RATIO = 2.0
IDLE_THRESHOLD = 0.2  # cores used by other processes above which a run counts as contended
READ_CHUNK = 16 << 20
STAMP = ".bench-quantize.json"  # marks a complete synthetic checkpoint (dot file: never copied)

# Llama-3-8B / Mistral-7B shapes; only the layer count grows with --size-gb.
SHAPE = dict(hidden=4096, intermediate=14336, heads=32, kv_heads=8, vocab=32000)

BASELINE_SRC = (
    "import sys, torch\n"
    f"buf = bytearray({READ_CHUNK})\n"
    "n = 0\n"
    "for p in sys.argv[1:]:\n"
    "    with open(p, 'rb', buffering=0) as f:\n"
    "        while (k := f.readinto(buf)):\n"
    "            n += k\n"
)


# --------------------------------------------------------------------------- synthetic checkpoint

def layer_shapes(i: int, hidden: int, intermediate: int, heads: int, kv_heads: int, **_) -> dict[str, tuple]:
    head_dim = hidden // heads
    p = f"model.layers.{i}."
    return {
        p + "input_layernorm.weight": (hidden,),
        p + "post_attention_layernorm.weight": (hidden,),
        p + "self_attn.q_proj.weight": (heads * head_dim, hidden),
        p + "self_attn.k_proj.weight": (kv_heads * head_dim, hidden),
        p + "self_attn.v_proj.weight": (kv_heads * head_dim, hidden),
        p + "self_attn.o_proj.weight": (hidden, heads * head_dim),
        p + "mlp.gate_proj.weight": (intermediate, hidden),
        p + "mlp.up_proj.weight": (intermediate, hidden),
        p + "mlp.down_proj.weight": (hidden, intermediate),
    }


def _numel(shape) -> int:
    return math.prod(shape)


def plan_layers(size_gb: float, shape: dict) -> int:
    """Smallest layer count whose bf16 checkpoint reaches size_gb (decimal GB)."""
    per_layer = 2 * sum(_numel(s) for s in layer_shapes(0, **shape).values())
    fixed = 2 * (2 * shape["vocab"] * shape["hidden"] + shape["hidden"])  # embed, lm_head, final norm
    return max(1, math.ceil((size_gb * 1e9 - fixed) / per_layer))


def config_json(layers: int, shape: dict) -> dict:
    h = shape["hidden"]
    return {
        "architectures": ["LlamaForCausalLM"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "dtype": "bfloat16",
        "head_dim": h // shape["heads"],
        "hidden_act": "silu",
        "hidden_size": h,
        "initializer_range": 0.02,
        "intermediate_size": shape["intermediate"],
        "max_position_embeddings": 8192,
        "mlp_bias": False,
        "model_type": "llama",
        "num_attention_heads": shape["heads"],
        "num_hidden_layers": layers,
        "num_key_value_heads": shape["kv_heads"],
        "pretraining_tp": 1,
        "rms_norm_eps": 1e-05,
        "rope_parameters": {"rope_theta": 500000.0, "rope_type": "default"},
        "tie_word_embeddings": False,
        "use_cache": True,
        "vocab_size": shape["vocab"],
    }


def make_checkpoint(out: Path, size_gb: float, seed: int = 0, shape: dict | None = None,
                    layers: int | None = None) -> Path:
    """Write a random bf16 Llama checkpoint of >= size_gb, one shard per decoder layer.

    Memory stays at about one shard (~0.45 GB of tensors + safetensors' copy):
    each shard's dict is built, saved with safetensors.save_file and dropped.
    Weights are N(0, 0.02) from a seeded generator (same seed -> same bytes);
    norm weights are ones. Written into a temp sibling and renamed, so an
    interrupted run never leaves a half checkpoint that looks complete.
    """
    import torch
    from safetensors.torch import save_file

    shape = dict(shape or SHAPE)
    layers = layers or plan_layers(size_gb, shape)
    stamp = {"size_gb": size_gb, "seed": seed, "layers": layers, **shape}
    if (out / STAMP).exists() and json.loads((out / STAMP).read_text()) == stamp:
        print(f"reusing {out} ({layers} layers)", file=sys.stderr)
        return out
    need = 2 * (layers * sum(_numel(s) for s in layer_shapes(0, **shape).values()) + 2 * shape["vocab"] * shape["hidden"])
    out.parent.mkdir(parents=True, exist_ok=True)
    if disk_free(out.parent) < need * 1.1:
        sys.exit(f"error: {out.parent} has {fmt_bytes(disk_free(out.parent))} free, the checkpoint needs {fmt_bytes(need)}")
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    g = torch.Generator().manual_seed(seed)

    def rand(shp):
        return torch.empty(shp, dtype=torch.bfloat16).normal_(0.0, 0.02, generator=g)

    n_shards = layers
    weight_map, total = {}, 0
    t0 = time.perf_counter()
    for i in range(layers):
        tensors = {}
        if i == 0:
            tensors["model.embed_tokens.weight"] = rand((shape["vocab"], shape["hidden"]))
        for name, shp in layer_shapes(i, **shape).items():
            tensors[name] = torch.ones(shp, dtype=torch.bfloat16) if len(shp) == 1 else rand(shp)
        if i == layers - 1:
            tensors["model.norm.weight"] = torch.ones(shape["hidden"], dtype=torch.bfloat16)
            tensors["lm_head.weight"] = rand((shape["vocab"], shape["hidden"]))
        fname = f"model-{i + 1:05d}-of-{n_shards:05d}.safetensors"
        save_file(tensors, str(tmp / fname), metadata={"format": "pt"})
        for name, t in tensors.items():
            weight_map[name] = fname
            total += t.numel() * t.element_size()
        del tensors
        print(f"  wrote {fname} ({i + 1}/{n_shards}, {time.perf_counter() - t0:.0f} s)", file=sys.stderr)
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    (tmp / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
    (tmp / "config.json").write_text(json.dumps(config_json(layers, shape), indent=2, sort_keys=True) + "\n")
    (tmp / STAMP).write_text(json.dumps(stamp) + "\n")
    shutil.rmtree(out, ignore_errors=True)
    os.rename(tmp, out)
    print(f"wrote {out}: {layers} layers, {fmt_bytes(total)} of bf16 tensors", file=sys.stderr)
    return out


def safetensors_files(model: Path) -> list[Path]:
    files = sorted(model.glob("*.safetensors"))
    if not files:
        sys.exit(f"error: no *.safetensors in {model}")
    return files


def largest_tensor_bytes(files: list[Path]) -> tuple[str, int]:
    """(name, bytes) of the largest tensor, from the safetensors headers alone."""
    best = ("", 0)
    for f in files:
        with open(f, "rb") as fh:
            (n,) = struct.unpack("<Q", fh.read(8))
            header = json.loads(fh.read(n))
        for name, info in header.items():
            if name == "__metadata__":
                continue
            size = info["data_offsets"][1] - info["data_offsets"][0]
            if size > best[1]:
                best = (name, size)
    return best


# --------------------------------------------------------------------------- runs

def tfcompile_argv() -> list[str]:
    exe = shutil.which("tfcompile")
    return [exe] if exe else [sys.executable, "-m", "tfcompile.cli.main"]


def warm_page_cache(files: list[Path]) -> float:
    t0 = time.perf_counter()
    buf = bytearray(READ_CHUNK)
    for p in files:
        with open(p, "rb", buffering=0) as f:
            while f.readinto(buf):
                pass
    return time.perf_counter() - t0


def check_ram(total: int) -> None:
    avail = 0
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            avail = int(line.split()[1]) * 1024
    if avail < 1.5 * total + 4e9:
        print(f"warning: {fmt_bytes(avail)} available RAM may not keep the {fmt_bytes(total)} model in the page "
              "cache next to the outputs; timings would then include disk reads", file=sys.stderr)


def dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def clear_output(out: Path) -> None:
    shutil.rmtree(out, ignore_errors=True)
    for p in out.parent.glob(f".{out.name}.*"):  # leftovers of an interrupted atomic write
        shutil.rmtree(p, ignore_errors=True)
    os.sync()


def bench_format(fmt: str, model: Path, files: list[Path], work: Path, repeat: int, env: dict,
                 idle_wait: float) -> dict:
    shutil.rmtree(env["TFCOMPILE_CACHE"], ignore_errors=True)  # each format's first run is cold
    out = work / f"out-{fmt}"
    base_argv = [sys.executable, "-c", BASELINE_SRC, *map(str, files)]
    ours_argv = [*tfcompile_argv(), "quantize", "--format", fmt, str(model), "-o", str(out), "--overwrite", "-q"]
    baseline: list[Timed] = []
    ours: list[Timed] = []
    out_bytes = 0
    busy: list[float] = []  # cores used by other processes just before each timed run
    for r in range(repeat):
        busy.append(wait_idle(idle_wait))
        b = run_timed(base_argv, env=env)
        if b.rc != 0:
            sys.exit(f"error: baseline failed (rc {b.rc}):\n{b.stderr_tail}")
        baseline.append(b)
        print(f"  [{fmt}] run {r + 1}/{repeat}: baseline {b.wall_s:6.2f} s  rss {fmt_bytes(b.max_rss_bytes)}  "
              f"(others: {busy[-1]:.2f} cores)",
              file=sys.stderr)
        clear_output(out)
        busy.append(wait_idle(idle_wait))
        t = run_timed(ours_argv, env=env)
        if t.rc != 0:
            sys.exit(f"error: {shlex.join(ours_argv)} failed (rc {t.rc}):\n{t.stderr_tail}")
        ours.append(t)
        out_bytes = dir_bytes(out)
        print(f"  [{fmt}] run {r + 1}/{repeat}: tfcompile {t.wall_s:6.2f} s  rss {fmt_bytes(t.max_rss_bytes)}  "
              f"cpu {t.user_s + t.sys_s:.1f} s  out {fmt_bytes(out_bytes)}  (others: {busy[-1]:.2f} cores)", file=sys.stderr)
        clear_output(out)
    return {"format": fmt, "baseline": baseline, "ours": ours, "out_bytes": out_bytes, "busy": busy,
            "command": shlex.join(["tfcompile", *ours_argv[-9:]]) if ours_argv[0].endswith("tfcompile")
            else shlex.join(ours_argv)}


def summarize(res: dict, budget: int) -> dict:
    b = median([x.wall_s for x in res["baseline"]])
    o = median([x.wall_s for x in res["ours"]])
    rss = max(x.max_rss_bytes for x in res["ours"])
    cold = res["ours"][0].wall_s
    warm = [x.wall_s for x in res["ours"][1:]]
    return {
        "format": res["format"], "baseline_s": b, "ours_s": o, "ratio": o / b, "cold_s": cold,
        "warm_median_s": median(warm) if warm else None,
        "cpu_s": median([x.user_s + x.sys_s for x in res["ours"]]),
        "rss": rss, "baseline_rss": max(x.max_rss_bytes for x in res["baseline"]), "budget": budget,
        "out_bytes": res["out_bytes"], "n": len(res["ours"]),
        "time_ok": o / b <= MAX_RATIO, "rss_ok": rss < budget,
        "runs_ours": [round(x.wall_s, 2) for x in res["ours"]],
        "runs_base": [round(x.wall_s, 2) for x in res["baseline"]],
        "busy_max": max(res["busy"]),
    }


def table(rows: list[dict]) -> str:
    head = ("| format | baseline median | tfcompile median | ratio (target <= 2.0) | cold run | CPU user+sys "
            "| peak RSS (max of runs) | RSS budget | output |\n"
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|\n")
    lines = []
    for s in rows:
        lines.append(
            f"| {s['format']} | {s['baseline_s']:.2f} s | {s['ours_s']:.2f} s | "
            f"**{s['ratio']:.2f}x** {'ok' if s['time_ok'] else 'MISSED'} | {s['cold_s']:.2f} s | {s['cpu_s']:.1f} s | "
            f"{fmt_bytes(s['rss'])} {'ok' if s['rss_ok'] else 'OVER'} | {fmt_bytes(s['budget'])} | "
            f"{fmt_bytes(s['out_bytes'])} |")
    return head + "\n".join(lines) + "\n"


def verdict(rows: list[dict]) -> str:
    out = []
    for s in rows:
        t = "met" if s["time_ok"] else "missed"
        r = "met" if s["rss_ok"] else "missed"
        out.append(f"{s['format']}: time target {t} ({s['ratio']:.2f}x of baseline, limit {MAX_RATIO:g}x), "
                   f"RSS target {r} ({fmt_bytes(s['rss'])} vs {fmt_bytes(s['budget'])}).")
    return "Result: " + " ".join(out)


def per_run_lines(rows: list[dict]) -> str:
    return "\n".join(f"- {s['format']}: baseline {s['runs_base']} s; tfcompile {s['runs_ours']} s; "
                     f"other processes used at most {s['busy_max']:.2f} cores just before a run"
                     + (" (CONTENDED: wall times are inflated)" if s["busy_max"] >= IDLE_THRESHOLD else "")
                     for s in rows) + "\n"


# --------------------------------------------------------------------------- profile

def profile_run(model: Path, work: Path, env: dict, fmt: str = "nvfp4a16", top: int = 25) -> str:
    """One cProfile'd run (main thread only; the source hasher thread is not seen)."""
    import io
    import pstats

    out = work / f"out-{fmt}-profile"
    prof = work / f"{fmt}.prof"
    clear_output(out)
    argv = [sys.executable, "-m", "cProfile", "-o", str(prof), "-m", "tfcompile.cli.main", "quantize",
            "--format", fmt, str(model), "-o", str(out), "--overwrite", "-q"]
    t0 = time.perf_counter()
    p = subprocess.run(argv, env=env, stdout=subprocess.DEVNULL)
    wall = time.perf_counter() - t0
    clear_output(out)
    if p.returncode != 0:
        return f"profile run failed (rc {p.returncode})"
    buf = io.StringIO()
    st = pstats.Stats(str(prof), stream=buf)
    st.sort_stats("tottime").print_stats(top)
    st.sort_stats("cumulative").print_stats(top)
    return f"cProfile of `tfcompile quantize --format {fmt}` ({wall:.2f} s under the profiler)\n" + buf.getvalue()


# --------------------------------------------------------------------------- main

def docs_body(rows: list[dict], cmd: str, model: Path, files: list[Path], total: int, largest: tuple[str, int],
              layers: int | None, machine: dict, scaling: float, idle_wait: float) -> str:
    shape = ", ".join(f"{k} {v}" for k, v in SHAPE.items())
    return f"""\
Acceptance criterion: quantizing a synthetic Llama-shaped checkpoint of at least 4 GB to nvfp4a16 and to
fp8-dynamic keeps peak RSS under 1.5 GB + the largest tensor, and takes at most 2x a baseline measured in
the same run.

Command (from the repository root):

```
{cmd}
```

Machine: {machine_line(machine)}; two concurrent CPU-bound processes ran at {scaling:.2f}x the throughput
of one (2.00 = two full cores). Code: commit `{git_revision()}` ("-dirty": tracked files other than this doc were modified).

Model: synthetic LlamaForCausalLM ({shape}{f', {layers} layers' if layers else ''}), random bf16 weights,
{len(files)} safetensors shards, {fmt_bytes(total)} on disk; largest tensor `{largest[0]}` =
{fmt_bytes(largest[1])}, so the RSS budget is 1.5 GB + {fmt_bytes(largest[1])} = {fmt_bytes(RSS_BASE + largest[1])}
(GB = 10^9 bytes). Generated by the script, not committed.

Baseline: one process, `python -c "import torch; ..."` that then reads every `*.safetensors` file of the
model front to back with unbuffered `readinto` into one reused 16 MiB bytearray. Every file is read once
untimed first, so the baseline and tfcompile both read from a warm page cache. tfcompile:
`tfcompile quantize --format F MODEL -o OUT --overwrite -q` (installed console script, fresh process).
Runs alternate baseline / tfcompile; OUT is deleted and `sync` run between runs, outside the timing.
Before each timed run the bench waits (up to {idle_wait:g} s) until other processes use < 0.2 cores.
Wall time is measured around the process; peak RSS is `/usr/bin/time -v`'s "Maximum resident set size".
Medians over {rows[0]['n'] if rows else 0} runs of each. The cold run is the first tfcompile run of each
format; the bench empties `TFCOMPILE_CACHE` (the fused-kernel build and the source sha256 cache) before
each format, so it includes the one-time C kernel build and hashing the source files; later runs reuse
both, as a second quantization of the same checkpoint on the same machine would.

{table(rows)}
{verdict(rows)}

Per run (wall seconds, in order):

{per_run_lines(rows)}"""


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--make", type=Path, metavar="DIR", help="only write the synthetic checkpoint into DIR")
    ap.add_argument("--model", type=Path, help="checkpoint to bench (made there if missing) "
                    "[default: WORK/llama-synth-SIZEgb]")
    ap.add_argument("--work", type=Path, default=DEFAULT_WORK, help=f"scratch dir [default: {DEFAULT_WORK}]")
    ap.add_argument("--size-gb", type=float, default=4.2, help="synthetic checkpoint size in GB [default: 4.2]")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--formats", default=",".join(DEFAULT_FORMATS), help="comma-separated formats")
    ap.add_argument("--repeat", type=int, default=3, help="runs of each (baseline and tfcompile) per format")
    ap.add_argument("--baseline-only", action="store_true", help="time only the baseline")
    ap.add_argument("--profile", action="store_true", help="also print a cProfile of one nvfp4a16 run")
    ap.add_argument("--write-docs", action="store_true", help=f"write the '{DOC_HEADING[3:]}' section of "
                    "docs/performance.md")
    ap.add_argument("--wait-idle", type=float, default=300, metavar="S",
                    help="before each run, wait up to S seconds for other processes to use < 0.2 cores "
                    "[default: 300]")
    ap.add_argument("--check", action="store_true", help="exit 1 when a target is missed")
    ap.add_argument("--clean", action="store_true", help="delete the synthetic checkpoint at the end")
    args = ap.parse_args(argv)

    if args.make:
        make_checkpoint(args.make, args.size_gb, args.seed)
        return 0

    require_gnu_time()
    work = args.work
    work.mkdir(parents=True, exist_ok=True)
    model = args.model or work / f"llama-synth-{args.size_gb:g}gb"
    if not (args.model and (model / "config.json").exists() and not (model / STAMP).exists()):
        make_checkpoint(model, args.size_gb, args.seed)  # reused when its stamp matches
    files = safetensors_files(model)
    total = sum(f.stat().st_size for f in files)
    largest = largest_tensor_bytes(files)
    budget = int(RSS_BASE + largest[1])
    layers = json.loads((model / "config.json").read_text()).get("num_hidden_layers")
    check_ram(total)
    if not args.baseline_only and disk_free(work) < 0.8 * total:
        sys.exit(f"error: {work} has {fmt_bytes(disk_free(work))} free; outputs need up to {fmt_bytes(0.8 * total)}")

    env = dict(os.environ)
    kcache = work / "kernel-cache"
    shutil.rmtree(kcache, ignore_errors=True)  # the first tfcompile run is the cold one
    env["TFCOMPILE_CACHE"] = str(kcache)
    env.setdefault("PYTHONUNBUFFERED", "1")

    machine = machine_description()
    scaling = cpu_scaling()
    print(f"machine: {machine_line(machine)}; 2-process CPU scaling {scaling:.2f}x", file=sys.stderr)
    print(f"model: {model} ({len(files)} files, {fmt_bytes(total)}; largest tensor {largest[0]} "
          f"{fmt_bytes(largest[1])}; RSS budget {fmt_bytes(budget)})", file=sys.stderr)
    print(f"warming the page cache: {warm_page_cache(files):.2f} s", file=sys.stderr)

    formats = [f.strip() for f in args.formats.split(",") if f.strip()]
    if args.baseline_only:
        runs = []
        for _ in range(args.repeat):
            wait_idle(args.wait_idle)
            runs.append(run_timed([sys.executable, "-c", BASELINE_SRC, *map(str, files)], env=env))
        walls = [r.wall_s for r in runs]
        print(f"baseline: median {median(walls):.2f} s over {walls}; peak RSS "
              f"{fmt_bytes(max(r.max_rss_bytes for r in runs))}; read {fmt_bytes(total)} "
              f"= {total / median(walls) / 1e9:.2f} GB/s incl. import torch")
        return 0

    rows = []
    for fmt in formats:
        rows.append(summarize(bench_format(fmt, model, files, work, args.repeat, env, args.wait_idle), budget))
    print()
    print(table(rows))
    print(verdict(rows) + "\n")
    print(per_run_lines(rows))

    if args.profile:
        print(profile_run(model, work, env))

    cmd = "python bench/quantize.py " + shlex.join(argv if argv is not None else sys.argv[1:])
    if args.write_docs:
        path = replace_doc_section(DOC_HEADING, docs_body(rows, cmd.strip(), model, files, total, largest, layers,
                                                          machine, scaling, args.wait_idle))
        print(f"updated {path}", file=sys.stderr)
    shutil.rmtree(kcache, ignore_errors=True)
    if args.clean:
        shutil.rmtree(model, ignore_errors=True)
    ok = all(s["time_ok"] and s["rss_ok"] for s in rows)
    print("all targets met" if ok else "TARGET MISSED", file=sys.stderr)
    return 1 if (args.check and not ok) else 0


if __name__ == "__main__":
    sys.exit(main())
