"""`TfcompileLM`: an lm-evaluation-harness model that scores an artifact as tfcompile serves it.

Registered with lm-eval's model registry as `tfcompile` when this module is imported:

    import lm_eval, tfcompile.tasks.adapter
    lm_eval.simple_evaluate(model="tfcompile", model_args="artifact=ART", tasks=[...])

`artifact=DIR` builds the model `tfcompile eval` scores (tfcompile.evaluate.models.load_candidate:
dequantized weights, activation and KV-cache emulation); `pretrained=DIR` a plain checkpoint (the
reference, loaded as `tfcompile eval --reference` loads it). The tokenizer is `tokenizer=DIR`, else
the model's own folder (an artifact carries its source's tokenizer files).

Requests are encoded as lm-eval's `hf` model encodes them (TemplateLM's context/continuation split,
the tokenizer's own special tokens, the BOS/EOS prefix for an empty context, windows of the model's
maximum length), so on a checkpoint the figures equal `--model hf`'s (tests/tasks). Forward passes
batch only requests of the same length: no padding, so batching changes no number.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import lm_eval.models  # noqa: F401  (the built-in models' lazy entries: `hf` stays available beside ours)
import torch
from lm_eval import utils as lm_utils
from lm_eval.api.model import TemplateLM
from lm_eval.api.registry import register_model

from tfcompile.dist.devices import resolve_device
from tfcompile.evaluate.errors import EvalError
from tfcompile.evaluate.models import load_candidate, load_checkpoint_model
from tfcompile.evaluate.runner import DTYPES
from tfcompile.evaluate.text import load_tokenizer

DEFAULT_MAX_LENGTH = 2048  # a model config without max_position_embeddings
DEFAULT_GEN_TOKENS = 256  # generate_until without max_gen_toks


@register_model("tfcompile")
class TfcompileLM(TemplateLM):
    """lm-eval's LM over a tfcompile artifact (`artifact=`) or a checkpoint (`pretrained=`)."""

    def __init__(self, artifact: str | None = None, pretrained: str | None = None, tokenizer: str | None = None,
                 dtype: str = "float32", kv_cache: str = "auto", batch_size: int | str = 8,
                 max_length: int | None = None, device: str | None = "auto", manifest: dict | None = None,
                 progress=None, **_ignored):
        super().__init__()
        if (artifact is None) == (pretrained is None):
            raise EvalError("the tfcompile lm-eval model needs exactly one of artifact=DIR and pretrained=DIR",
                            hint="model_args='artifact=ART' (as served) or 'pretrained=CHECKPOINT' (reference)")
        if dtype not in DTYPES:
            raise EvalError(f"unknown dtype {dtype!r}", hint="choose one of: " + ", ".join(DTYPES))
        path = Path(artifact or pretrained)
        if artifact is not None:  # the candidate as `tfcompile eval` scores it
            self.model = load_candidate(path, DTYPES[dtype], kv_cache, manifest).model
        else:
            self.model = load_checkpoint_model(path, DTYPES[dtype], "reference")
        self.model.eval()
        self.tokenizer = load_tokenizer(Path(tokenizer) if tokenizer else path)
        self._device = resolve_device(device or "auto")  # auto: the GPU when torch sees one
        self.model.to(self.device)
        self.batch_size = max(1, int(batch_size)) if str(batch_size).isdigit() else 8  # "auto": 8
        self.max_length = int(max_length or getattr(self.model.config, "max_position_embeddings", None)
                              or DEFAULT_MAX_LENGTH)
        self.progress = progress  # tfcompile's Progress (task/advance), or None

    # --- tokenization: as lm-eval's hf model (HFLM.tok_encode, prefix_token_id) ---
    @property
    def eot_token_id(self) -> int:
        return self.tokenizer.eos_token_id

    @property
    def prefix_token_id(self) -> int:
        bos = self.tokenizer.bos_token_id
        return bos if bos is not None else self.tokenizer.eos_token_id

    def tok_encode(self, string: str, add_special_tokens: bool | None = None, **kwargs) -> list[int]:
        kw = {} if add_special_tokens is None else {"add_special_tokens": add_special_tokens}
        bos = self.tokenizer.decode(self.prefix_token_id)
        if add_special_tokens is None and bos and string.startswith(bos):
            kw["add_special_tokens"] = False  # the string carries its BOS already
        return self.tokenizer.encode(string, **kw)

    # --- scoring ---
    def _loglikelihood_tokens(self, requests, disable_tqdm: bool = False, **kwargs) -> list[tuple[float, bool]]:
        """(sum of log p(continuation | context), continuation is the greedy one) per request."""
        inputs = []  # (request index, model input ids, continuation ids)
        for i, (_, ctx, cont) in enumerate(requests):
            ids = (ctx + cont)[-(self.max_length + 1):][:-1]  # the last token is only predicted
            inputs.append((i, ids, cont))
        out: list[tuple[float, bool] | None] = [None] * len(requests)
        for batch in self._same_length_batches(inputs, "loglikelihood"):
            ids = torch.tensor([b[1] for b in batch], dtype=torch.long, device=self.device)  # [B, L]
            with torch.inference_mode():
                logp = torch.log_softmax(self.model(input_ids=ids).logits.float(), dim=-1)  # [B, L, V]
            for row, (i, inp, cont) in zip(logp, batch):
                tail = row[len(inp) - len(cont):]  # [len(cont), V]: the positions predicting cont
                target = torch.tensor(cont, dtype=torch.long, device=tail.device)
                greedy = bool((tail.argmax(-1) == target).all())
                out[i] = (float(tail.gather(-1, target[:, None]).sum()), greedy)
                self._cache_hook(requests[i][0], out[i])
        return out  # type: ignore[return-value]

    def _same_length_batches(self, inputs: list, what: str) -> Iterator[list]:
        """Batches of up to batch_size inputs of one length (longest first); progress per batch."""
        by_len: dict[int, list] = {}
        for item in inputs:
            by_len.setdefault(len(item[1]), []).append(item)
        batches = [group[j:j + self.batch_size] for n in sorted(by_len, reverse=True)
                   for group in [by_len[n]] for j in range(0, len(group), self.batch_size)]
        if self.progress is not None:
            self.progress.task(what, len(inputs))
        for b in batches:
            yield b
            if self.progress is not None:
                self.progress.advance(len(b), f"{len(b[0][1])} tokens")

    def _cache_hook(self, key, value) -> None:
        if key is not None and key[0] is not None:
            self.cache_hook.add_partial("loglikelihood", key, value)

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        """Log-likelihood of whole strings, in disjoint windows of max_length (as lm-eval's hf model)."""
        windows, owner = [], []
        for r, (string,) in enumerate(req.args for req in requests):
            for ctx, cont in map(lm_utils.make_disjoint_window, lm_utils.get_rolling_token_windows(
                    token_list=self.tok_encode(string), prefix_token=self.prefix_token_id,
                    max_seq_len=self.max_length, context_len=1)):
                windows.append((None, ctx, cont))
                owner.append(r)
        totals = [0.0] * len(requests)
        for r, (ll, _) in zip(owner, self._loglikelihood_tokens(windows)):
            totals[r] += ll
        for req, total in zip(requests, totals):
            self.cache_hook.add_partial("loglikelihood_rolling", req.args, total)
        return totals

    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        """Greedy decoding up to max_gen_toks new tokens, cut at the first `until` string."""
        out = []
        for req in requests:
            context, gen = req.args
            gen = dict(gen or {})
            until = gen.get("until") or [self.tokenizer.decode(self.eot_token_id)]
            until = [until] if isinstance(until, str) else list(until)
            new = int(gen.get("max_gen_toks", DEFAULT_GEN_TOKENS))
            ids = self.tok_encode(context)[-max(1, self.max_length - new):]
            text = self._greedy(ids, min(new, self.max_length - len(ids)))
            for stop in until:
                if stop and stop in text:
                    text = text[:text.index(stop)]
            self.cache_hook.add_partial("generate_until", (context, req.args[1]), text)
            out.append(text)
        return out

    def _greedy(self, ids: list[int], new: int) -> str:
        x = torch.tensor([ids], dtype=torch.long, device=self.device)  # [1, L]
        with torch.inference_mode():
            y = self.model.generate(input_ids=x, attention_mask=torch.ones_like(x), max_new_tokens=max(new, 0),
                                    do_sample=False, pad_token_id=self.tokenizer.pad_token_id or self.eot_token_id)
        return self.tokenizer.decode(y[0, len(ids):], skip_special_tokens=True)
