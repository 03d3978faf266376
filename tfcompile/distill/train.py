"""The optimization loop: optimizer, LR schedule, gradient accumulation, checkpoints, progress.

A run is one or more `Segment`s trained in turn (the whole model: one; layerwise:
one per decoder layer), on one global step counter. Checkpoints (checkpoint.py)
hold every trainable parameter, the current segment's optimizer and scheduler
state and the RNG state, at a step boundary, so resuming replays nothing and the
result is bit-identical to an uninterrupted run on the same machine and thread
count (CPU kernels are deterministic for a fixed thread count; the loop also sets
torch.use_deterministic_algorithms).

Ctrl-C (SIGINT) and SIGTERM (timeout, Slurm, Kubernetes) are taken at the next
step boundary: a checkpoint is written (with --resume-dir) and the run stops with
KeyboardInterrupt (`Terminated`: exit 130 / 143); a second signal stops at once.
A kill loses at most `checkpoint_every` steps.
"""

from __future__ import annotations

import contextlib
import math
import signal
import threading
import time
from dataclasses import dataclass
from typing import Callable

import torch

from tfcompile.distill.checkpoint import MetricsLog, ResumeDir
from tfcompile.dist.devices import one_torch_thread
from tfcompile.distill.fsdp import full, load_optimizer_state, optimizer_state, placed_like, squares_by_row
from tfcompile.io.signals import Terminated, installed


@dataclass
class Segment:
    name: str  # "model" or "layer 3"
    params: list  # [(name, nn.Parameter)] trained in this segment
    first: int  # global step at which it starts
    steps: int
    step_fn: Callable[[int], dict]  # local step -> loss parts (floats); runs forward + backward


def lr_factor(step: int, cfg) -> float:
    """Linear warmup over cfg.warmup steps, then cosine / linear / constant to cfg.min_lr_ratio."""
    if step < cfg.warmup:
        return (step + 1) / cfg.warmup
    if cfg.schedule == "constant":
        return 1.0
    p = min(1.0, (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup))
    shape = 0.5 * (1.0 + math.cos(math.pi * p)) if cfg.schedule == "cosine" else 1.0 - p
    return cfg.min_lr_ratio + (1.0 - cfg.min_lr_ratio) * shape


def make_optimizer(params: list, cfg) -> torch.optim.Optimizer:
    ps, lr = [p for _, p in params], cfg.learning_rate
    if cfg.optimizer == "sgd":
        return torch.optim.SGD(ps, lr=lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay)
    cls = torch.optim.AdamW if cfg.optimizer == "adamw" else torch.optim.Adam
    return cls(ps, lr=lr, betas=tuple(cfg.betas), weight_decay=cfg.weight_decay, foreach=False)


class Loop:
    def __init__(self, cfg, *, resume: ResumeDir | None, metrics_path, reporter, total_steps: int,
                 tokens_per_step: int):
        self.cfg, self.resume, self.reporter = cfg, resume, reporter
        self.params: dict = {}  # every trainable parameter adopted so far, by name
        self.total, self.tokens_per_step = total_steps, tokens_per_step
        self.state = resume.load() if resume else None
        self.done = 0
        if self.state is not None:
            torch.set_rng_state(self.state["rng"])
            self.done = int(self.state["step"])
        self.resumed_at = self.done
        self.metrics = MetricsLog(metrics_path, self.done)
        self.last: dict = dict(self.state.get("losses", {})) if self.state else {}
        self._t0 = time.perf_counter()
        self._stop = False
        self.saves = True  # under torchrun only rank 0 writes checkpoints (every rank reads them)
        self.sharded = False  # FSDP2: every rank gathers its shards for rank 0's checkpoint
        self.agree: Callable | None = None  # under torchrun: the stop flag every rank acts on

    def adopt(self, params: list) -> None:
        """Track `params` (name, parameter) for checkpoints; restore them from the checkpoint
        being resumed, if it has them (every segment trained so far)."""
        saved = self.state["params"] if self.state is not None else {}
        with torch.no_grad():
            for name, p in params:
                self.params[name] = p
                if name in saved:
                    p.copy_(placed_like(saved[name], p))

    def run(self, seg: Segment) -> None:
        """Train `seg` from wherever the checkpoint left it (nothing when it is complete)."""
        if self.done >= seg.first + seg.steps:
            return
        opt = make_optimizer(seg.params, self.cfg)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_factor(s, self.cfg))
        st = self.state
        if st is not None and st["segment"] == seg.name and self.done > seg.first:
            load_optimizer_state(opt, st["optimizer"])
            sched.load_state_dict(st["scheduler"])
        self.reporter.task(f"distill {seg.name}", seg.steps)
        self.reporter.advance(self.done - seg.first)
        with _sigint_at_step_boundary(self):
            for local in range(self.done - seg.first, seg.steps):
                opt.zero_grad(set_to_none=True)
                parts = seg.step_fn(local)
                gn = _clip([p for _, p in seg.params], self.cfg.grad_clip)
                lr = opt.param_groups[0]["lr"]
                opt.step()
                sched.step()
                self.done += 1
                self.last = {**parts, "grad_norm": gn, "lr": lr}
                self._log(seg, local)
                self.after_step(self.done)
                if self.agree is not None:  # a signal seen by one rank stops all at this step
                    self._stop = self.agree(self._stop)
                end = local + 1 == seg.steps
                if self.resume and (self.saves or self.sharded) and \
                        (self.done % self.cfg.checkpoint_every == 0 or end or self._stop):
                    self._save(seg, opt, sched)
                if self._stop:
                    raise Terminated(self._stop) if type(self._stop) is int else KeyboardInterrupt
        opt.zero_grad(set_to_none=True)

    def after_step(self, step: int) -> None:
        """Called after each optimizer step (a seam for tests that interrupt a run)."""

    def _save(self, seg: Segment, opt, sched) -> None:
        """The checkpoint: whole tensors on the CPU (FSDP2 shards gathered: one file for any
        sharding), written by the rank that `saves`."""
        state = {"step": self.done, "segment": seg.name,
                 "params": {n: full(p) for n, p in self.params.items()},
                 "optimizer": optimizer_state(opt), "scheduler": sched.state_dict(),
                 "rng": torch.get_rng_state(), "losses": dict(self.last)}
        if self.saves:
            self.resume.save(state)

    def _log(self, seg: Segment, local: int) -> None:
        elapsed = time.perf_counter() - self._t0
        rate = elapsed / max(1, self.done - self.resumed_at)  # seconds per step in this process
        eta = rate * (self.total - self.done)
        loss = self.last.get("loss", float("nan"))
        self.reporter.advance(1, f"loss {loss:.4f}  lr {self.last['lr']:.2e}")  # the progress line has the ETA
        if self.done % self.cfg.log_every and local + 1 != seg.steps:
            return
        rec = {"step": self.done, "segment": seg.name, "tokens": self.done * self.tokens_per_step,
               **{k: _r(v) for k, v in self.last.items()},
               "elapsed_s": round(elapsed, 2), "eta_s": round(eta, 1)}
        self.metrics.write(rec)
        note = getattr(self.reporter, "note", None)
        if note is not None:
            note(f"distill {seg.name} step {self.done}/{self.total}  loss {loss:.5f}  "
                 f"lr {self.last['lr']:.2e}  {1 / rate if rate else 0:.2f} steps/s  eta {_hms(eta)}")


def _clip(params: list, max_norm: float) -> float:
    """Clip the gradients to a global L2 norm of `max_norm` (0: no clipping), as
    torch.nn.utils.clip_grad_norm_ does (x max_norm / (norm + 1e-6) when that is below 1); returns
    the norm. The norm is computed so that its bits do not depend on how the gradients are split
    over ranks or threads: squares summed per row (dim 0) in float64 (a row lies whole on one FSDP2
    rank), the rows gathered whole, summed on one thread, then the parameters' sums in order."""
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return 0.0
    with one_torch_thread():
        norm = math.sqrt(sum(float(squares_by_row(g).sum()) for g in grads))
    coef = max_norm / (norm + 1e-6)
    if max_norm > 0 and coef < 1.0:
        for g in grads:
            g.mul_(coef)
    return norm


@contextlib.contextmanager
def _sigint_at_step_boundary(loop: Loop):
    """First Ctrl-C or SIGTERM: finish the step, checkpoint, stop. Second: stop now. Main thread only."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    def handler(signum, frame):
        if loop._stop:
            raise Terminated(signum)
        loop._stop = signum

    with installed(handler, (signal.SIGINT, signal.SIGTERM)):
        yield


@contextlib.contextmanager
def deterministic():
    """torch.use_deterministic_algorithms for the run, restored afterwards."""
    was = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(was)


def _hms(s: float) -> str:
    if not math.isfinite(s):
        return "?"
    s = int(round(s))
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"


def _r(v):
    return float(f"{v:.6g}") if isinstance(v, float) and math.isfinite(v) else v
