"""When one rank fails, the whole run fails, names the rank and the pass, and leaves no output.

Every rank records in the c10d store which pass it is in (`pass/R`) and how it ended
(`state/R`: finished or stopped). A rank whose own code raised writes `failed/R` (its pass and
message) before it exits, then exits 1 (torchrun then stops the other workers with SIGTERM).
The others notice in one of three ways: a store wait sees the failure record
(`World.wait_until`), a collective errors because the peer's sockets closed (gloo) or timed
out (NCCL: TFCOMPILE_DIST_TIMEOUT), or torchrun's SIGTERM, which `supervise` turns into an
exception so the staging directory is removed on the way out. They then read the records
(for up to GRACE_S) and report "rank F failed in pass P: ..." or, when F left no record
(SIGKILL, out of memory, a lost node), "rank F stopped responding during pass P".
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time

from tfcompile.errors import TfcompileError, UserError
from tfcompile.io.signals import Terminated, unwinding
from tfcompile.settings import settings

GRACE_S = 5.0  # how long a stopped rank waits for the failed rank's record


class PeerFailed(UserError):
    """Another rank failed (or vanished); this rank stopped. Exit 1."""


class RankFailed(TfcompileError):
    """This rank's own failure, prefixed with its rank; keeps the inner exit code."""

    def __init__(self, message: str, hint: str | None, exit_code: int):
        super().__init__(message, hint)
        self.exit_code = exit_code


def note_pass(world, name: str) -> None:
    world.current_pass = name
    if world.distributed:
        world.store.set(world.key(f"pass/{world.rank}"), name)


def inject_fault(world, name: str) -> None:
    """Testing knob: TFCOMPILE_FAULT=RANK:PASS:raise|kill fails that rank at the start of PASS
    (or at a named point inside one: `distill-step-K`, after distillation's optimizer step K)."""
    spec = settings().fault
    if not spec or not world.distributed:
        return
    rank, pass_name, how = (spec.split(":") + ["", "", ""])[:3]
    if rank == str(world.rank) and pass_name == name:
        if how == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        raise RuntimeError(f"fault injected by TFCOMPILE_FAULT={spec}")


def peer_failure(world) -> str | None:
    """'rank F failed in pass P: message' for the lowest failed peer that left a record."""
    if not world.distributed or not world.store.check([world.key("failed")]):
        return None
    for r in range(world.size):
        key = world.key(f"failed/{r}")
        if r != world.rank and world.store.check([key]):
            rec = json.loads(world.store.get(key))
            return f"rank {r} failed in pass '{rec['pass']}': {rec['message']}"
    return None


@contextlib.contextmanager
def supervise(world):
    """Run a distributed invocation: any failure is re-raised as RankFailed (this rank's own) or
    PeerFailed (another rank's, or torchrun's SIGTERM after one), both naming rank and pass.
    One process: nothing changes."""
    if not world.distributed:
        yield
        return
    try:
        yield
        _set_state(world, "finished")
    except BaseException as e:  # noqa: BLE001 - classified and re-raised
        unwinding()  # torchrun's SIGTERM, which follows a failure, must not cut the report short
        cause = _root_cause(e)
        if isinstance(cause, PeerFailed) or _peer_caused(cause):
            _set_state(world, "stopped")
            raise PeerFailed(f"rank {world.rank} of {world.size} stopped in pass '{world.current_pass}': "
                             f"{_diagnose(world, cause)}",
                             hint="fix the failed rank's error above; nothing was written to the output "
                                  "path") from e
        message = getattr(e, "message", None) or f"{type(cause).__name__}: {cause}"
        _report(world, getattr(cause, "message", None) or f"{type(cause).__name__}: {cause}")
        if isinstance(cause, KeyboardInterrupt):  # Ctrl-C / SIGHUP here: recorded, then the CLI's exit
            raise
        raise RankFailed(f"rank {world.rank} of {world.size}: {message}", getattr(e, "hint", None),
                         getattr(e, "exit_code", 2)) from e


def _report(world, message: str) -> None:
    if not world.distributed:
        return
    with contextlib.suppress(Exception):  # the store may be gone with the agent
        world.store.set(world.key(f"failed/{world.rank}"),
                        json.dumps({"pass": world.current_pass, "message": message}))
        world.store.add(world.key("failed"), 1)
        _set_state(world, "failed")


def _set_state(world, state: str) -> None:
    if world.distributed:
        with contextlib.suppress(Exception):
            world.store.set(world.key(f"state/{world.rank}"), state)


def _diagnose(world, cause: BaseException) -> str:
    """Wait up to GRACE_S for the failed rank's record; else name the ranks that left none."""
    silent: list[int] = []
    with contextlib.suppress(Exception):
        deadline = time.monotonic() + GRACE_S
        while True:
            found = peer_failure(world)
            if found:
                return found
            silent = [r for r in range(world.size)
                      if r != world.rank and not world.store.check([world.key(f"state/{r}")])]
            if not silent or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        if silent:
            where = [_pass_of(world, r) for r in silent]
            who = ", ".join(f"rank {r} (in pass '{p}')" for r, p in zip(silent, where))
            return f"{who} stopped responding: killed by a signal, out of memory, or its node was lost " \
                   "(torchrun's report names the signal)"
    if isinstance(cause, PeerFailed):
        return cause.message
    return f"a peer stopped ({type(cause).__name__}: {str(cause).splitlines()[0] if str(cause) else ''})"


def _pass_of(world, r: int) -> str:
    key = world.key(f"pass/{r}")
    return world.store.get(key).decode() if world.store.check([key]) else "setup"


def _root_cause(e: BaseException) -> BaseException:
    while getattr(e, "inner", None) is not None:  # PassFailed wraps the pass's exception
        e = e.inner
    return e


def _peer_caused(e: BaseException) -> bool:
    """Errors that mean a peer went away: torchrun's SIGTERM, collective/store failures."""
    import torch.distributed as dist  # lazy: torch.distributed only under torchrun

    if isinstance(e, Terminated) and e.signum == signal.SIGTERM or isinstance(e, dist.DistError):
        return True
    text = str(e)
    return isinstance(e, RuntimeError) and any(s in text for s in ("Gloo", "gloo", "NCCL", "Connection closed",
                                                                   "Connection reset", "Broken pipe"))

