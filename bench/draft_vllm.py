"""vLLM's CPU build serving a `tfcompile draft` EAGLE-3 draft: its own acceptance counters.

Runs tests/engines/vllm_driver.py `generate` (vLLM in its own venv, scripts/vllm_env.sh) on SmolLM2-135M
(bf16, as vLLM loads it) with speculative_config {"method": "eagle3", "model": DRAFT,
"num_speculative_tokens": K}, greedy, on the prompts bench/draft.py measures (python-doc's held-out
split, --prompts x 64 tokens, --new-tokens each), and prints one JSON line: vLLM's spec-decode
counters, its mean acceptance length 1 + accepted / drafts (tokens per target forward, the figure
bench/draft.py's reference decoder reports) and the acceptance rate per draft token.

    python bench/draft_vllm.py --draft DIR [--k 4] [--prompts 8] [--new-tokens 64]
    python bench/draft_vllm.py --draft ngram [--k 4]    # vLLM's prompt lookup (n = 1..4), the floor

vLLM serves the target in bf16 and the reference decoder in float32, so their greedy outputs part on
near-ties; the figures are comparable, not identical.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import tempfile
import time
from pathlib import Path

from common import REPO, machine_line  # noqa: E402

DRIVER = REPO / "tests" / "engines" / "vllm_driver.py"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--draft", required=True, help="a `tfcompile draft` output directory, or `ngram`")
    ap.add_argument("--k", type=int, default=4, help="num_speculative_tokens")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--new-tokens", type=int, default=64)
    args = ap.parse_args()

    from tfcompile.draft.acceptance import prompts_of
    from tfcompile.evaluate.text import load_tokenizer
    from tfcompile.fixtures.smollm2 import smollm2_checkpoint

    smol = str(smollm2_checkpoint())
    rows = prompts_of(None, load_tokenizer(Path(smol)), count=args.prompts, prompt_len=64, vocab=49152)
    py = subprocess.run(["bash", str(REPO / "scripts" / "vllm_env.sh")], capture_output=True, text=True,
                        check=True).stdout.strip()
    spec = ({"method": "ngram", "prompt_lookup_min": 1, "prompt_lookup_max": 4} if args.draft == "ngram"
            else {"method": "eagle3", "model": str(Path(args.draft).resolve())})  # ngram: NGramDrafter's n range
    spec["num_speculative_tokens"] = args.k
    env = dict(os.environ, VLLM_ENABLE_V1_MULTIPROCESSING="0", VLLM_CPU_KVCACHE_SPACE="1", HF_HUB_OFFLINE="1",
               TRANSFORMERS_OFFLINE="1")
    env.pop("PYTHONPATH", None)
    with tempfile.TemporaryDirectory() as tmp:
        req = Path(tmp) / "request.json"
        req.write_text(json.dumps({"prompts": rows, "max_tokens": args.new_tokens, "logprobs": 1,
                                   "max_model_len": 256, "engine_by_path": {smol: {"speculative_config": spec}}}))
        t0, load = time.perf_counter(), os.getloadavg()[0]
        res = subprocess.run([py, str(DRIVER), "generate", str(req), smol], capture_output=True, text=True, env=env,
                             cwd=str(DRIVER.parent))
    if res.returncode != 0 or not res.stdout.strip():
        raise SystemExit(f"vllm_driver failed ({res.returncode}):\n{res.stderr[-3000:]}")
    out = json.loads(res.stdout.strip().splitlines()[-1])[0]
    if "error" in out:
        raise SystemExit(f"vLLM: {out['error']}\n{out.get('traceback', '')}")
    c = out["spec_decode"]
    drafts, tokens, accepted = (c[f"vllm:spec_decode_num_{n}"] for n in ("drafts", "draft_tokens", "accepted_tokens"))
    print(json.dumps({"draft": str(args.draft), "k": args.k, "prompts": len(rows), "new_tokens": args.new_tokens,
                      "counters": c, "acceptance_length": round(1 + accepted / drafts, 4),
                      "accepted_per_draft_token": round(accepted / tokens, 4),
                      "wall_s": round(time.perf_counter() - t0, 1), "load": round(load, 1),
                      "machine": machine_line()}))


if __name__ == "__main__":
    main()
