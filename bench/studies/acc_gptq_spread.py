"""How far apart are equally valid GPTQ solves of SmolLM2 nvfp4a16, with and without error
propagation, and where does llm-compressor's GPTQ land among them?

GPTQ's column sweep is chaotic in its inputs: relative changes of 1.6e-4 (q/k/v) to 2.2e-3
(down_proj) in layer 1's Hessians, what a different float summation order gives after one
propagated layer, flip 7% of q_proj's codes and 21% of down_proj's (measured on SmolLM2). So two correct GPTQ runs that differ
in the last bits of a global scale or in the order of a sum land on different, equally valid
solutions, and a GPTQ-to-GPTQ comparison between two tools needs this spread beside it.

Every variant is solved by tfcompile's own GPTQ (`gptq_values`: act-order, dampening 0.01,
blocks of 128) on the 16 x 512 `--calib python-doc` ids that bench/peers.py gives both tools,
with every decoder Linear quantized (q/k/v and gate/up sharing a global scale), and scored
weights-only in bf16 on the held-out tokens (bench/heldout.py). Variants:

- Hessians: `orig`, from one forward of the bf16 model (tfcompile's default); `prop`, layer i's
  from the model whose layers < i already hold their GPTQ weights (llm-compressor's sequential
  pipeline, tfcompile's `calibrate.propagate`).
- the global scale g = 2688 / amax: as computed, and nudged by 1 + 2^-10, 1 - 2^-10, 1 + 2^-8.
- with `--llmc-dump DIR` (written by `bench/peers_llmc.py ... --method gptq --dump DIR` in
  llm-compressor's venv: the inputs of its every `quantize_weight` call): llm-compressor's own
  Hessians and block scales (its rule: e4m3(bf16(amax / 6) * g), g rounded to bf16), each
  crossed with tfcompile's.
- with `--pipeline`: whole `tfcompile quantize --algorithm gptq` runs, nvfp4a16 and nvfp4 (W4A4),
  without and with `--set calibrate.propagate=true`, on other calibration draws
  (`--calib-seed 1, 2`: other 16 x 512 samples of the same split), scored as `tfcompile eval`
  scores the artifact (W4A4 inputs emulated). Seed 0 is bench/acc_smollm2.py's `gptq` and
  `gptq-prop` rows.

    python -m bench run acc_gptq_spread [--max-tokens 8192] [--llmc-dump DIR] [--pipeline] [--only LABEL ...]

Results: $TFCOMPILE_CACHE/bench/smollm2-gptq-spread.json (`--table` prints them).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import torch

from bench.studies.acc_rtn_spread import groups  # noqa: E402
from bench.common import replace_doc_section  # noqa: E402
from bench.heldout import ACCURACY_DOC, CALIB_SAMPLES, CALIB_SEQ, HeldOut, Results, bench_parser  # noqa: E402

STORE = Results("smollm2-gptq-spread")
NUDGES = {"g": 1.0, "g*(1+2^-10)": 1 + 2 ** -10, "g*(1-2^-10)": 1 - 2 ** -10, "g*(1+2^-8)": 1 + 2 ** -8}
# label -> (Hessians, block scales, factor on g)
VARIANTS = {f"{h} / {n}": (h, "tfcompile", f) for h in ("orig", "prop") for n, f in NUDGES.items()}
# label -> (format, propagate, calibration seed): whole pipeline runs (--pipeline)
PIPELINE = {f"{fmt} {'prop' if p else 'orig'} seed {seed}": (fmt, p, seed)
            for fmt in ("nvfp4a16", "nvfp4") for seed in (1, 2) for p in (False, True)}
LLMC_VARIANTS = {"llmc / llmc": ("llmc", "llmc", 1.0), "llmc / g": ("llmc", "tfcompile", 1.0),
                 "orig / llmc": ("orig", "llmc", 1.0)}


class Spread:
    """The bf16 model, its decoder Linears' original weights and fusion groups, the calibration ids."""

    def __init__(self, path: Path, llmc_dump: Path | None):
        from transformers import AutoModelForCausalLM

        from tfcompile.calibration.datasets import calibration_tokens
        from tfcompile.calibration.forward import load_tokenizer
        from tfcompile.kernels import formats as F

        self.F = F
        self.model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16).eval()
        self.mods = dict(self.model.named_modules())
        self.groups = groups(self.model)  # "model.layers.3.self_attn.qkv" -> its Linears
        self.orig = {n: self.mods[n].weight.data.clone() for names in self.groups.values() for n in names}
        self.ids = calibration_tokens("python-doc", load_tokenizer(path), samples=CALIB_SAMPLES,
                                      seq_len=CALIB_SEQ, seed=0)  # [16, 512]
        self.grid = F.quantizer_of(F.quantize_nvfp4(next(iter(self.orig.values()))))
        self.llmc = _load_dump(llmc_dump) if llmc_dump else {}
        self._orig_h: dict[str, torch.Tensor] | None = None

    def restore(self) -> None:
        for n, w in self.orig.items():
            self.mods[n].weight.data = w.clone()

    def hessians(self, layer: int | None) -> dict[str, torch.Tensor]:
        """X^T X / tokens of each group's bf16 input: of every layer (None), or of `layer` only,
        running the model's first layer + 1 decoder layers as they are now."""
        h, rows, hooks = {}, {}, []
        keys = [g for g in self.groups if layer is None or f".layers.{layer}." in g]
        for g in keys:
            def hook(mod, args, g=g):
                x = args[0].detach().reshape(-1, args[0].shape[-1]).float()
                h[g] = h.get(g, 0) + x.T @ x
                rows[g] = rows.get(g, 0) + x.shape[0]
            hooks.append(self.mods[self.groups[g][0]].register_forward_pre_hook(hook))
        layers = self.model.model.layers
        if layer is not None:
            self.model.model.layers = layers[: layer + 1]
        try:
            with torch.inference_mode():
                for row in self.ids:
                    self.model.model(input_ids=row[None])
        finally:
            self.model.model.layers = layers
            for k in hooks:
                k.remove()
        return {g: h[g] / rows[g] for g in keys}

    def multipliers(self, name: str, scales: str, factor: float) -> torch.Tensor:
        """Each element's dequantization multiplier [N, K]: llm-compressor's dumped block scale / g,
        or tfcompile's RTN scales under the group's global scale times `factor`."""
        if scales == "llmc":
            r = self.llmc[name]
            return (r["scale"] / r["global_scale"]).repeat_interleave(16, dim=1)
        group = next(ns for ns in self.groups.values() if name in ns)
        amax = torch.stack([self.orig[n].float().abs().amax() for n in group]).amax()
        q = self.F.quantize_nvfp4(self.orig[name], global_scale=self.F.nvfp4_global_scale(amax.reshape(1)) * factor)
        return self.F.quantizer_of(q).multipliers(q)

    def solve(self, group: str, h: torch.Tensor | None, scales: str, factor: float) -> None:
        """GPTQ every member of `group` (with its own dumped Hessian when h is None) into the model."""
        from tfcompile.passes.quantize.gptq import gptq_values

        for n in self.groups[group]:
            hn = self.llmc[n]["hessians"] if h is None else h
            vals = gptq_values(self.orig[n].float(), hn, self.multipliers(n, scales, factor), self.grid)
            self.mods[n].weight.data = vals.to(torch.bfloat16)

    def quantize(self, hess: str, scales: str, factor: float) -> None:
        if hess == "prop":  # layer by layer, each layer's Hessians under the quantized layers before it
            for i in range(self.model.config.num_hidden_layers):
                for g, h in self.hessians(i).items():
                    self.solve(g, h, scales, factor)
            return
        if hess == "orig" and self._orig_h is None:
            self._orig_h = self.hessians(None)
        for g in self.groups:
            self.solve(g, self._orig_h[g] if hess == "orig" else None, scales, factor)


def _load_dump(path: Path) -> dict[str, dict[str, torch.Tensor]]:
    """Module name -> its weights / hessians / scale / global_scale from bench/peers_llmc.py --dump."""
    out = {}
    for f in sorted(Path(path).glob("*.pt")):
        rec = torch.load(f, weights_only=True)
        for i, name in enumerate(rec["names"]):
            out[name] = {k: rec[k][i] for k in ("hessians", "scale", "global_scale")}
    return out


def measure(labels: list[str], variants: dict, held: HeldOut, spread: Spread, results: dict) -> None:
    for label in labels:
        hess, scales, factor = variants[label]
        t0 = time.perf_counter()
        spread.quantize(hess, scales, factor)
        solve_s = time.perf_counter() - t0
        r = held.score(spread.model)
        spread.restore()
        results[label] = {"hessians": hess, "scales": scales, "g_factor": factor, "solve_s": round(solve_s, 1),
                          **{k: r[k] for k in ("kl_mean", "perplexity", "ppl_increase", "top1_agreement")}}
        print(f"{label:24s} KL {r['kl_mean']:.5f}  ppl {r['perplexity']:.3f}  top-1 {r['top1_agreement']:.4f}",
              file=sys.stderr, flush=True)
        STORE.save(results)


def measure_pipeline(labels: list[str], path: Path, held: HeldOut, results: dict) -> None:
    import subprocess
    import tempfile

    for label in labels:
        fmt, prop, seed = PIPELINE[label]
        with tempfile.TemporaryDirectory(prefix="tfc-gptq-spread-") as tmp:
            argv = ["tfcompile", "quantize", str(path), "-o", tmp, "--format", fmt, "-q", "--overwrite",
                    "--algorithm", "gptq", "--calib", "python-doc", "--calib-samples", str(CALIB_SAMPLES),
                    "--calib-seq-len", str(CALIB_SEQ), "--calib-seed", str(seed)]
            argv += ["--set", "calibrate.propagate=true"] if prop else []
            t0 = time.perf_counter()
            subprocess.run(argv, check=True)
            r = held.score_artifact(Path(tmp))
        results[label] = {"hessians": "prop" if prop else "orig", "scales": "tfcompile", "g_factor": 1.0,
                          "format": fmt, "calib_seed": seed, "quantize_s": round(time.perf_counter() - t0, 1),
                          **{k: r[k] for k in ("kl_mean", "perplexity", "ppl_increase", "top1_agreement")}}
        print(f"{label:24s} KL {r['kl_mean']:.5f}  ppl {r['perplexity']:.3f}", file=sys.stderr, flush=True)
        STORE.save(results)


HEADING = "## SmolLM2-135M-Instruct: the spread of GPTQ solves"
ORDER = [*VARIANTS, *LLMC_VARIANTS, *PIPELINE]


def table(results: dict) -> str:
    lines = ["| run | Hessians | block scales | KL | perplexity (change) | top-1 |", "|---|---|---|---:|---:|---:|"]
    for label in [x for x in ORDER if x in results]:
        r = results[label]
        g = label.split(" / ")[-1] if r["scales"] == "tfcompile" else "g in bf16"
        run = label if label in PIPELINE else f"GPTQ solve, {g}"
        scales = {"llmc": "llm-compressor's", "tfcompile": "tfcompile's"}[r["scales"]]
        hess = {"orig": "original model", "prop": "propagated", "llmc": "llm-compressor's"}[r["hessians"]]
        lines.append(f"| {run} | {hess} | {scales} | {r['kl_mean']:.4f} | {r['perplexity']:.3f} "
                     f"({100 * r['ppl_increase']:+.2f}%) | {r['top1_agreement']:.4f} |")
    return "\n".join(lines)


def summary(results: dict) -> str:
    """KL range and mean per kind of Hessian: of the nudged solves, and of the pipeline runs per format."""
    out = []
    for hess in ("orig", "prop"):
        kl = [results[x]["kl_mean"] for x in VARIANTS if x in results and VARIANTS[x][0] == hess]
        if kl:
            out.append(f"GPTQ solves, {hess}: KL {min(kl):.4f}-{max(kl):.4f}, mean {sum(kl) / len(kl):.4f} "
                       f"over {len(kl)} global scales")
    seed0 = Results("smollm2-accuracy").load()  # bench/acc_smollm2.py's rows: the pipeline's seed 0
    for fmt in ("nvfp4a16", "nvfp4"):
        for prop in (False, True):
            row = seed0.get(f"{fmt}/gptq-prop" if prop else f"{fmt}/gptq")
            kl = [row["kl_mean"]] if row else []
            kl += [results[x]["kl_mean"] for x, v in PIPELINE.items() if x in results and v[:2] == (fmt, prop)]
            if kl:
                out.append(f"{fmt} pipeline, {'prop' if prop else 'orig'}: KL {min(kl):.4f}-{max(kl):.4f}, mean "
                           f"{sum(kl) / len(kl):.4f} over {len(kl)} calibration draws")
    return "; ".join(out)


def body(results: dict, max_tokens: int) -> str:
    return (f"Command: `python -m bench run acc_gptq_spread --max-tokens {max_tokens} --llmc-dump DIR --pipeline "
            "--write-docs` (module docstring; DIR from `bench/peers_llmc.py MODEL OUT --scheme NVFP4A16 "
            "--method gptq --tokens IDS --dump DIR` in llm-compressor's venv, IDS the ids bench/peers.py "
            "writes). nvfp4a16, every decoder Linear, 16 x 512 python-doc calibration tokens (seed 0 unless "
            "the run says otherwise), scored weights-only in bf16 on the first "
            f"{max_tokens} held-out tokens. \"GPTQ solve\" rows: tfcompile's `gptq_values` on the Hessians "
            "and block scales named, g the fused group's global scale (nudged where shown); the other rows "
            "are whole `tfcompile quantize --algorithm gptq` runs (`prop`: `--set calibrate.propagate=true`; "
            "nvfp4 is W4A4), scored as `tfcompile eval` scores the artifact; their seed 0 is "
            f"bench/acc_smollm2.py's `gptq` and `gptq-prop` rows ({seed0()}). For comparison, "
            "llm-compressor's own GPTQ artifact: KL 0.0907 (peer table above).\n\n" + table(results)
            + "\n\n" + summary(results) + ".")


def seed0() -> str:
    """The KL of bench/acc_smollm2.py's stored gptq / gptq-prop rows (the pipeline runs' seed 0)."""
    rows = Results("smollm2-accuracy").load()
    kl = lambda name: f"{rows[name]['kl_mean']:.4f}" if name in rows else "not measured"  # noqa: E731
    return "; ".join(f"{fmt}: {kl(f'{fmt}/gptq')} and {kl(f'{fmt}/gptq-prop')}" for fmt in ("nvfp4a16", "nvfp4"))


def run(args, results: dict) -> None:
    """Measure the variants asked for (all by default) into `results`, saved after each."""
    from tfcompile.fixtures.smollm2 import smollm2_checkpoint

    path = smollm2_checkpoint()
    variants = {**VARIANTS, **(LLMC_VARIANTS if args.llmc_dump else {})}
    known = [*variants, *(PIPELINE if args.pipeline else [])]
    unknown = [x for x in args.only or [] if x not in known]
    if unknown:
        raise SystemExit(f"unknown variant {unknown[0]!r}; hint: one of {', '.join(known)}")
    labels = args.only or known
    held = HeldOut(path, max_tokens=args.max_tokens)
    solves = [x for x in labels if x in variants]
    if solves:
        measure(solves, variants, held, Spread(path, args.llmc_dump), results)
    measure_pipeline([x for x in labels if x in PIPELINE], path, held, results)


def main() -> int:
    ap = bench_parser(__doc__)
    ap.add_argument("--llmc-dump", type=Path, help="bench/peers_llmc.py --dump DIR of the same model and ids")
    ap.add_argument("--pipeline", action="store_true", help="whole tfcompile GPTQ runs on other calibration draws")
    args = ap.parse_args()
    results = STORE.load()
    if not args.table:
        run(args, results)
    if args.write_docs:  # the section of docs/accuracy.md, then the table on stdout
        replace_doc_section(HEADING, body(results, args.max_tokens), ACCURACY_DOC)
    print(table(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
