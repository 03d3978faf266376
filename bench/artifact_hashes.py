"""The sha256 of every file of every artifact in a matrix of runs: the byte-identity gate.

Builds the demo LM (examples/demo-lm) and a tiny Qwen3-MoE (tests/fixtures/models.py) into
artifacts in every format, with and without calibration, with each weight algorithm (GPTQ,
MSE, AWQ; mostly on the smaller examples/tiny-llama, where their solves are cheap), engine layouts, the modelopt and ONNX views, Triton kernels and CUTLASS sources
(`--cutlass never`: nvcc builds are slow and need CUDA 12.8+), `--eval`, and one
`tfcompile distill` run, and records the sha256 of every file of every artifact.

    python bench/artifact_hashes.py --record      # write bench/artifact_hashes.baseline.json
    python bench/artifact_hashes.py --check       # rebuild and diff against it (exit 1 on a difference)
    python bench/artifact_hashes.py --check --only demo-nvfp4 moe-fp8

Settings are small (a few calibration sequences, one M bucket, two distillation steps), so
the whole matrix runs in a few minutes on two cores. Every run is the real CLI
(`tfcompile.cli.main.main`), in this process. Bytes depend on the installed versions
(the manifest records them; Triton's cubins follow Triton), so the baseline records the
environment and `--check` refuses to compare across environments: re-record on the
reference commit first. tests/test_artifact_hashes.py checks a subset (`CI_CASES`).

The bytes of a calibrated, searched, solved, distilled or evaluated run also follow the CPU
(float sums rounded in the order of its SIMD width: tfcompile/machine.py); such an artifact's
manifest names the CPU (`machine`), and data-free RTN's names none, being the same on every
CPU. So each case is recorded with whether it is CPU-dependent, and the baseline with the CPU
it was recorded on (`cpu`, `tfcompile.machine.cpu_key`). On another CPU, the CPU-independent
cases are compared as always; the CPU-dependent ones against that CPU's own recording
(`other_cpus`, written by `--record-cpu` there) where there is one, else they are rebuilt
twice and must be byte-identical run to run, with the baseline's file list.

Beside them, the model families and the safety and reporting outputs: tiny GPT-OSS and
DeepSeek-V3 (tests/fixtures/families.py: per-expert calibration and `--calib-all-experts`, the
per-expert GPTQ batches, sinks / MLA KV layouts, MoE eval emulation), the same models as they are
published (DeepSeek's FP8 blocks, GPT-OSS's MXFP4 experts: tests/fixtures/published.py) re-quantized,
a signed artifact (`--sign`, with a fixed ed25519 key; Ed25519 signatures are deterministic, and
`verify --public-key` must accept it), the HTML report (`--report`) and MODEL as a Hub id
(a Hub-layout cache of the demo LM built here, offline).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import importlib.metadata
import importlib.util
import io
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path

from tfcompile.machine import cpu_key

REPO = Path(__file__).resolve().parent.parent
BASELINE = REPO / "bench" / "artifact_hashes.baseline.json"
DEMO = REPO / "examples" / "demo-lm"
TINY = REPO / "examples" / "tiny-llama"  # random-init Llama (hidden 128): the cheap model for slow algorithms
TOKENIZER = TINY  # a committed tokenizer for the MoE (see build_moe)
THREADS = 2  # GPTQ's and distillation's float sums depend on the thread count: fix it
# What the bytes depend on besides the code: the baseline holds these versions.
PACKAGES = ("torch", "triton", "transformers", "tokenizers", "safetensors", "numpy", "compressed-tensors",
            "nvidia-modelopt", "onnx", "ml_dtypes", "nvidia-cutlass", "datasets")

FORMATS = ("nvfp4", "nvfp4a16", "mxfp4", "mxfp4a16", "mxfp8", "fp8", "fp8-dynamic", "fp8-block")
CALIB = ("--calib", "random", "--calib-samples", "4", "--calib-seq-len", "64")
STATIC = ("nvfp4", "fp8")  # formats with static activation scales: they always calibrate
KERNELS = ("--target", "sm_90a,sm_100a", "--cutlass", "never", "--set", "emit.buckets=[16]")
KEY = "{KEY}"  # replaced by the path of the fixed signing key (the recorded arguments keep the placeholder)
HUB_REPO = "tfcompile-bench/demo-lm"  # the demo LM as a Hub id, from a cache built here (offline)
HUB_COMMIT = "0123456789abcdef0123456789abcdef01234567"
SIGNING_SEED = bytes(range(32))  # the ed25519 private key's seed: a fixed key, so fixed signatures


def calib(fmt: str) -> tuple[str, ...]:
    """The calibration options, for a format whose pipeline calibrates anyway (else none: the
    calibrate pass is not scheduled and its options are refused)."""
    return CALIB if fmt in STATIC else ()


def cases() -> dict[str, tuple[str, tuple[str, ...]]]:
    """case name -> (model: "demo" | "tiny" | "moe", CLI arguments after MODEL -o OUT)."""
    c: dict[str, tuple[str, tuple[str, ...]]] = {}
    for fmt in FORMATS:  # every format, plain (nvfp4 and fp8 calibrate their static input scales)
        c[f"demo-{fmt}"] = ("demo", ("quantize", "--format", fmt, *calib(fmt)))
        c[f"moe-{fmt}"] = ("moe", ("quantize", "--format", fmt, *calib(fmt)))
    for fmt in FORMATS:  # calibrated FP8 KV cache + the TensorRT-LLM view
        c[f"demo-{fmt}-kv-modelopt"] = ("demo", ("quantize", "--format", fmt, *CALIB, "--kv-cache", "fp8",
                                                 "--export", "modelopt"))
    # GPTQ, MSE, AWQ and the mse observer on the small tiny-llama (their solves and searches are
    # the slow part); one demo LM run each for the larger shapes
    c["demo-nvfp4-gptq"] = ("demo", ("quantize", "--format", "nvfp4", *CALIB, "--algorithm", "gptq"))
    c["moe-nvfp4-gptq"] = ("moe", ("quantize", "--format", "nvfp4", *CALIB, "--algorithm", "gptq"))
    for fmt in ("mxfp4", "mxfp8", "fp8-block", "fp8", "nvfp4a16"):
        c[f"tiny-{fmt}-gptq"] = ("tiny", ("quantize", "--format", fmt, *CALIB, "--algorithm", "gptq"))
    c["demo-mxfp4-mse"] = ("demo", ("quantize", "--format", "mxfp4", "--algorithm", "mse"))
    for fmt in ("nvfp4", "mxfp4a16", "mxfp8"):
        c[f"tiny-{fmt}-mse"] = ("tiny", ("quantize", "--format", fmt, *calib(fmt), "--algorithm", "mse"))
    c["demo-fp8-awq"] = ("demo", ("quantize", "--format", "fp8", *CALIB, "--algorithm", "awq"))
    for fmt in ("nvfp4", "mxfp4a16", "mxfp8", "fp8-dynamic", "fp8-block"):
        c[f"tiny-{fmt}-awq"] = ("tiny", ("quantize", "--format", fmt, *CALIB, "--algorithm", "awq"))
    c["tiny-nvfp4-observer-mse"] = ("tiny", ("quantize", "--format", "nvfp4", *CALIB, "--observer", "mse"))
    c["demo-fp8-observer-percentile"] = ("demo", ("quantize", "--format", "fp8", *CALIB,
                                                  "--observer", "percentile"))
    c["demo-nvfp4-whole-kv-per-head"] = ("demo", ("quantize", "--format", "nvfp4", *CALIB, "--kv-cache", "fp8",
                                                       "--kv-per-head", "--set", "calibrate.mode=whole"))
    c["demo-nvfp4-trtllm-tp2"] = ("demo", ("quantize", "--format", "nvfp4", *CALIB, "--kv-cache", "fp8",
                                           "--layout", "trtllm", "--tp", "2"))
    c["demo-fp8-vllm"] = ("demo", ("quantize", "--format", "fp8", *CALIB, "--kv-cache", "fp8", "--layout", "vllm"))
    c["demo-fp8-block-trtllm"] = ("demo", ("quantize", "--format", "fp8-block", "--layout", "trtllm", "--tp", "2"))
    c["moe-mxfp4-trtllm"] = ("moe", ("quantize", "--format", "mxfp4", "--layout", "trtllm"))
    for fmt in ("nvfp4", "fp8", "mxfp8", "fp8-dynamic", "mxfp4a16"):
        c[f"demo-{fmt}-onnx"] = ("demo", ("quantize", "--format", fmt, *calib(fmt), "--export", "onnx"))
    c["tiny-nvfp4-onnx-modelopt"] = ("tiny", ("quantize", "--format", "nvfp4", *CALIB, "--export", "onnx",
                                              "--export", "modelopt"))
    for fmt in ("nvfp4", "fp8", "mxfp4"):
        c[f"demo-{fmt}-kernels"] = ("demo", ("quantize", "--format", fmt, *calib(fmt), *KERNELS))
    c["moe-fp8-block-kernels"] = ("moe", ("quantize", "--format", "fp8-block", *KERNELS))
    c["demo-fp8-eval"] = ("demo", ("quantize", "--format", "fp8", *CALIB, "--kv-cache", "fp8", "--eval",
                                   "--eval-tokens", "512"))
    c["demo-nvfp4-shards-all"] = ("demo", ("quantize", "--format", "nvfp4", *CALIB, "--kv-cache", "fp8",
                                           "--export", "modelopt", "--export", "onnx", "--layout", "trtllm",
                                           *KERNELS, "--eval", "--eval-tokens", "256",
                                           "--set", "pack.max_shard_mb=2"))
    c["demo-mxfp4-distill"] = ("demo", ("distill", "--format", "mxfp4", "--steps", "2", "--batch", "2",
                                        "--data", "random", "--set", "distill.seq_len=32",
                                        "--set", "distill.heldout_tokens=128"))
    c["demo-nvfp4-distill-scales"] = ("demo", ("distill", "--format", "nvfp4", *CALIB, "--steps", "2", "--batch",
                                               "2", "--train", "scales", "--data", "random",
                                               "--set", "distill.seq_len=32", "--set", "distill.heldout_tokens=0"))
    # model families (tests/fixtures/families.py) and their published formats (tests/fixtures/published.py)
    c["gptoss-mxfp4"] = ("gptoss", ("quantize", "--format", "mxfp4"))
    c["gptoss-nvfp4-kv"] = ("gptoss", ("quantize", "--format", "nvfp4", *CALIB, "--kv-cache", "fp8",
                                       "--layout", "vllm"))
    c["gptoss-nvfp4-all-experts-gptq"] = ("gptoss", ("quantize", "--format", "nvfp4", *CALIB, "--calib-all-experts",
                                                     "--algorithm", "gptq"))
    c["gptoss-mxfp8-eval"] = ("gptoss", ("quantize", "--format", "mxfp8", "--eval", "--eval-max-tokens", "256"))
    c["deepseek-fp8-block"] = ("deepseek", ("quantize", "--format", "fp8-block"))
    c["deepseek-nvfp4-gptq-kv"] = ("deepseek", ("quantize", "--format", "nvfp4", *CALIB, "--algorithm", "gptq",
                                                "--kv-cache", "fp8", "--layout", "sglang"))
    c["deepseek-fp8-awq-modelopt"] = ("deepseek", ("quantize", "--format", "fp8", *CALIB, "--algorithm", "awq",
                                                   "--export", "modelopt"))
    c["deepseek-mxfp4-eval"] = ("deepseek", ("quantize", "--format", "mxfp4", "--eval", "--eval-max-tokens", "256"))
    c["published-fp8-block-nvfp4"] = ("deepseek-fp8", ("quantize", "--format", "nvfp4", *CALIB))
    c["published-fp8-block-mxfp8"] = ("deepseek-fp8", ("quantize", "--format", "mxfp8"))
    c["published-mxfp4-nvfp4a16"] = ("gptoss-mxfp4", ("quantize", "--format", "nvfp4a16"))
    c["published-mxfp4-fp8-gptq"] = ("gptoss-mxfp4", ("quantize", "--format", "fp8", *CALIB, "--algorithm", "gptq"))
    # safety and reporting: a signed artifact, the HTML report, a Hub id
    c["demo-nvfp4-signed"] = ("demo", ("quantize", "--format", "nvfp4", *CALIB, "--sign", KEY))
    c["demo-fp8-eval-report-signed"] = ("demo", ("quantize", "--format", "fp8", *CALIB, "--eval",
                                                 "--eval-max-tokens", "256", "--report", "--sign", KEY))
    c["moe-mxfp4-report-kernels"] = ("moe", ("quantize", "--format", "mxfp4", "--report", *KERNELS))
    c["demo-mxfp4-distill-signed"] = ("demo", ("distill", "--format", "mxfp4", "--steps", "2", "--batch", "2",
                                               "--data", "random", "--set", "distill.seq_len=32",
                                               "--set", "distill.heldout_tokens=0", "--sign", KEY))
    c["hub-mxfp8"] = ("hub", ("quantize", "--revision", "main", "--format", "mxfp8"))
    c["hub-nvfp4-report"] = ("hub", ("quantize", "--format", "nvfp4", *CALIB, "--report"))
    return c


# A small representative subset tests/test_artifact_hashes.py rebuilds in CI (~1 min).
CI_CASES = ("demo-nvfp4-kv-modelopt", "moe-fp8-block", "tiny-mxfp4-gptq", "tiny-nvfp4-awq", "demo-nvfp4a16",
            "published-mxfp4-nvfp4a16",
            "demo-nvfp4-trtllm-tp2", "demo-fp8-onnx", "demo-fp8-kernels", "demo-fp8-eval",
            "demo-mxfp4-distill", "gptoss-nvfp4-all-experts-gptq", "published-fp8-block-nvfp4",
            "demo-fp8-eval-report-signed", "hub-mxfp8")


def environment() -> dict[str, str | None]:
    env: dict[str, str | None] = {"python": platform.python_version()}
    for p in PACKAGES:
        try:
            env[p] = importlib.metadata.version(p)
        except importlib.metadata.PackageNotFoundError:
            env[p] = None
    return env


def digest(root: Path) -> dict[str, str]:
    """Relative path -> sha256 of every file under root, sorted."""
    return {p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def build_moe(dest: Path) -> Path:
    """The tiny Qwen3-MoE of tests/fixtures/models.py, with the committed tiny-llama tokenizer in
    place of the one the fixture trains (a trained BPE differs between `tokenizers` versions, and
    the artifact copies the tokenizer files verbatim)."""
    spec = importlib.util.spec_from_file_location("_tfc_bench_models", REPO / "tests" / "fixtures" / "models.py")
    models = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(models)
    models.make_tokenizer = lambda out_dir, vocab: None  # noqa: ARG005 - replaced by the copy below
    models.make_tiny_qwen3_moe(dest)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(TOKENIZER / name, dest / name)
    return dest


def _fixture(name: str):
    """tests/fixtures/<name>.py, loaded by path (it imports nothing from the tests)."""
    spec = importlib.util.spec_from_file_location(f"_tfc_bench_{name}", REPO / "tests" / "fixtures" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def build_family(name: str, dest: Path) -> Path:
    """A tiny family checkpoint ("gptoss", "deepseek"), or one as published ("deepseek-fp8": DeepSeek's
    FP8 128x128 blocks; "gptoss-mxfp4": GPT-OSS's MXFP4 experts), built under dest."""
    families = _fixture("families")
    base, published = {"gptoss": ("gpt_oss", None), "deepseek": ("deepseek_v3", None),
                       "deepseek-fp8": ("deepseek_v3", "to_fp8_block"),
                       "gptoss-mxfp4": ("gpt_oss", "to_mxfp4")}[name]
    make = getattr(families, f"make_tiny_{base}")
    if published is None:
        return make(dest / name)
    src = dest / base if (dest / base).is_dir() else make(dest / base)
    return getattr(_fixture("published"), published)(src, dest / name)


def build_hub(dest: Path) -> tuple[Path, Path]:
    """A Hub cache (huggingface_hub's layout: blobs, refs/main, snapshots/<commit>/ symlinks) holding
    the demo LM as HUB_REPO@HUB_COMMIT; returns (cache, snapshot)."""
    snap = _fixture("hub").make_hub_cache(dest, DEMO, HUB_REPO, HUB_COMMIT)
    return dest, snap


def signing_key(dest: Path) -> tuple[Path, Path]:
    """The fixed ed25519 key pair (PKCS#8 PEM private, SubjectPublicKeyInfo PEM public) under dest."""
    from cryptography.hazmat.primitives import serialization as ser
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    key = Ed25519PrivateKey.from_private_bytes(SIGNING_SEED)
    dest.mkdir(parents=True, exist_ok=True)
    private, public = dest / "release.pem", dest / "release.pub"
    private.write_bytes(key.private_bytes(ser.Encoding.PEM, ser.PrivateFormat.PKCS8, ser.NoEncryption()))
    public.write_bytes(key.public_key().public_bytes(ser.Encoding.PEM, ser.PublicFormat.SubjectPublicKeyInfo))
    return private, public


class _HubEnv:
    """HF_HUB_CACHE / HF_HUB_OFFLINE for the Hub cases only (restored afterwards)."""

    def __init__(self, cache: Path | None):
        self.cache, self.saved = cache, {}

    def __enter__(self):
        if self.cache is not None:
            for k, v in (("HF_HUB_CACHE", str(self.cache)), ("HF_HUB_OFFLINE", "1")):
                self.saved[k] = os.environ.get(k)
                os.environ[k] = v
        return self

    def __exit__(self, *exc):
        for k, v in self.saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def run_case(argv: list[str]) -> None:
    from tfcompile.cli.main import main

    code = main(argv)
    if code != 0:
        raise SystemExit(f"error: tfcompile {' '.join(argv)} exited {code}")


def check_signature(dest: Path, public: Path) -> None:
    """`verify --public-key` accepts the signature and the manifest's integrity digest."""
    from tfcompile.cli.main import main

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        main(["verify", str(dest), "--public-key", str(public), "--json"])
    checks = {c["check"]: c for c in json.loads(buf.getvalue())["checks"]}
    bad = [c for c in ("signature", "manifest integrity") if not checks[c]["ok"]]
    if bad:
        raise SystemExit(f"error: {dest}: verify's {bad} check failed: {[checks[c]['detail'] for c in bad]}")


def build(names: list[str], work: Path, verbose: bool = True) -> dict:
    """Run the named cases under `work`; returns {"sources": ..., "artifacts": ...}."""
    import torch

    torch.set_num_threads(THREADS)
    all_cases = cases()
    models = {"demo": DEMO, "tiny": TINY}
    wanted = {all_cases[n][0] for n in names}
    if "moe" in wanted:
        models["moe"] = build_moe(work / "src" / "tiny-qwen3-moe")
    for fam in ("gptoss", "deepseek", "deepseek-fp8", "gptoss-mxfp4"):
        if fam in wanted:
            models[fam] = build_family(fam, work / "src")
    hub_cache = None
    if "hub" in wanted:
        hub_cache, models["hub"] = build_hub(work / "src" / "hub")
    private, public = signing_key(work / "keys")
    out: dict = {"cpu": cpu_key(), "sources": {m: digest(p) for m, p in sorted(models.items())},
                 "artifacts": {}}
    for i, name in enumerate(names, 1):
        model, args = all_cases[name]
        dest = work / "out" / name
        ref = HUB_REPO if model == "hub" else str(models[model])
        argv = [args[0], ref, "-o", str(dest), "-q", *(str(private) if a == KEY else a for a in args[1:])]
        t0 = time.perf_counter()
        with _HubEnv(hub_cache if model == "hub" else None):
            run_case(argv)
        if KEY in args:  # the signature covers the manifest as finally written
            check_signature(dest, public)
        manifest = json.loads((dest / "tfcompile" / "manifest.json").read_text())
        out["artifacts"][name] = {"model": model, "args": list(args), "files": digest(dest),
                                  "cpu_dependent": "machine" in manifest}
        shutil.rmtree(dest)
        if verbose:
            print(f"[{i}/{len(names)}] {name}: {len(out['artifacts'][name]['files'])} files "
                  f"({time.perf_counter() - t0:.1f} s)", file=sys.stderr, flush=True)
    return out


def expected(baseline: dict, name: str, cpu: str) -> dict[str, str] | None:
    """The files case `name` must have on CPU `cpu`: the baseline's where the case is
    CPU-independent or `cpu` is the baseline's; that CPU's own recording (`other_cpus`); else None
    (a CPU-dependent case on a CPU nobody recorded: check it run to run, `compare_runs`)."""
    want = baseline["artifacts"][name]
    if not want.get("cpu_dependent") or baseline.get("cpu") == cpu:
        return want["files"]
    return baseline.get("other_cpus", {}).get(cpu, {}).get(name)


def compare(baseline: dict, got: dict, names: list[str]) -> list[str]:
    """Human-readable differences (empty: byte-identical). A CPU-dependent case on a CPU the
    baseline has no recording for is not compared here (`expected` is None): see compare_runs."""
    problems = []
    for m, files in got["sources"].items():
        if baseline["sources"].get(m) != files:
            problems.append(f"source {m}: the input checkpoint itself differs from the baseline's")
    for name in names:
        want = baseline["artifacts"].get(name)
        have = got["artifacts"][name]
        if want is None:
            problems.append(f"{name}: not in the baseline (re-record)")
            continue
        if want["args"] != have["args"]:
            problems.append(f"{name}: arguments differ from the baseline's (re-record)")
        if bool(want.get("cpu_dependent")) != bool(have.get("cpu_dependent")):
            problems.append(f"{name}: CPU-dependent {have.get('cpu_dependent')}, baseline "
                            f"{want.get('cpu_dependent')} (the manifest's `machine` record)")
        w = expected(baseline, name, got.get("cpu", cpu_key()))
        if w is None:
            continue
        h = have["files"]
        for rel in sorted(set(w) | set(h)):
            if rel not in h:
                problems.append(f"{name}: {rel} missing")
            elif rel not in w:
                problems.append(f"{name}: {rel} is new")
            elif w[rel] != h[rel]:
                problems.append(f"{name}: {rel} differs")
    return problems


def compare_runs(baseline: dict, first: dict, second: dict, names: list[str]) -> list[str]:
    """For CPU-dependent cases on a CPU without a recording: two builds here must be byte-identical,
    and hold the baseline's files (names)."""
    problems = []
    for name in names:
        a, b = first["artifacts"][name]["files"], second["artifacts"][name]["files"]
        problems += [f"{name}: {rel} differs between two runs on this CPU" for rel in sorted(a) if a[rel] != b.get(rel)]
        if sorted(a) != sorted(baseline["artifacts"][name]["files"]):
            problems.append(f"{name}: files {sorted(set(a) ^ set(baseline['artifacts'][name]['files']))} "
                            "differ from the baseline's list")
    return problems


def env_mismatch(baseline: dict) -> list[str]:
    now = environment()
    return [f"{k}: baseline {baseline['environment'].get(k)}, here {v}" for k, v in now.items()
            if baseline["environment"].get(k) != v]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = ap.add_mutually_exclusive_group(required=True)
    mode.add_argument("--record", action="store_true", help="build every case and write the baseline")
    mode.add_argument("--record-cpu", action="store_true", help="build every case and add this CPU's "
                      "recording of the CPU-dependent ones (other_cpus) to the baseline")
    mode.add_argument("--check", action="store_true", help="rebuild and compare with the baseline")
    mode.add_argument("--list", action="store_true", help="print the case names")
    ap.add_argument("--only", nargs="+", metavar="CASE",
                    help="only these cases (--check; --record: rerecord just them, e.g. after a default changed on purpose)")
    ap.add_argument("--ci", action="store_true", help="only the CI subset (CI_CASES)")
    ap.add_argument("--baseline", type=Path, default=BASELINE)
    args = ap.parse_args(argv)
    all_cases = cases()
    if args.list:
        print("\n".join(all_cases))
        return 0
    names = list(args.only or (CI_CASES if args.ci else all_cases))
    unknown = [n for n in names if n not in all_cases]
    if unknown:
        print(f"error: unknown case(s) {unknown}\nhint: --list prints them", file=sys.stderr)
        return 2
    if args.check or args.record_cpu or (args.record and args.only):
        baseline = json.loads(args.baseline.read_text())
        mismatch = env_mismatch(baseline)
        if mismatch:
            print("error: this environment differs from the baseline's; bytes are not comparable:\n  "
                  + "\n  ".join(mismatch) + "\nhint: --record on the reference commit first", file=sys.stderr)
            return 2
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="tfc-hashes-") as tmp:
        got = build(names, Path(tmp))
        unrecorded = [n for n in names if args.check and expected(baseline, n, got["cpu"]) is None]
        again = build(unrecorded, Path(tmp) / "again") if unrecorded else None
    seconds = time.perf_counter() - t0
    if args.record_cpu:
        if args.only or args.ci:
            print("error: --record-cpu writes the whole matrix; drop --only/--ci", file=sys.stderr)
            return 2
        if got["cpu"] == baseline.get("cpu"):
            print(f"error: this is the baseline's own CPU ({got['cpu']}); use --record", file=sys.stderr)
            return 2
        baseline.setdefault("other_cpus", {})[got["cpu"]] = {
            n: a["files"] for n, a in got["artifacts"].items() if a["cpu_dependent"]}
        args.baseline.write_text(json.dumps(baseline, indent=1, sort_keys=True) + "\n")
        print(f"recorded the CPU-dependent cases for {got['cpu']} -> {args.baseline}")
        return 0
    if args.record and args.only:  # the other cases' recordings stay as they are
        if got["cpu"] != baseline.get("cpu"):
            print(f"error: the baseline was recorded on {baseline.get('cpu')}, this is {got['cpu']}",
                  file=sys.stderr)
            return 2
        baseline["artifacts"].update(got["artifacts"])
        baseline["sources"].update(got.get("sources", {}))
        args.baseline.write_text(json.dumps(baseline, indent=1, sort_keys=True) + "\n")
        print(f"rerecorded {', '.join(names)} -> {args.baseline}")
        return 0
    if args.record:
        if args.ci:
            print("error: --record writes the whole matrix; drop --ci", file=sys.stderr)
            return 2
        doc = {"environment": environment(), **got}
        args.baseline.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
        files = sum(len(a["files"]) for a in got["artifacts"].values())
        print(f"recorded {len(names)} artifacts, {files} files in {seconds:.0f} s -> {args.baseline}")
        return 0
    problems = compare(baseline, got, names)
    if again is not None:
        problems += compare_runs(baseline, got, again, unrecorded)
        print(f"note: {len(unrecorded)} CPU-dependent case(s) have no recording for {got['cpu']} (baseline: "
              f"{baseline.get('cpu')}); checked run to run instead: {', '.join(unrecorded)}", file=sys.stderr)
    if problems:
        print(f"FAIL: {len(problems)} difference(s):\n  " + "\n  ".join(problems))
        return 1
    files = sum(len(got["artifacts"][n]["files"]) for n in names)
    print(f"ok: {len(names)} artifacts, {files} files byte-identical to the baseline ({seconds:.0f} s)")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    sys.exit(main())
