"""Errors of `tfcompile eval`; both are UserErrors (exit 1, with a hint)."""

from __future__ import annotations

from tfcompile.errors import UserError


class EvalError(UserError):
    """Bad input to an evaluation: a model, reference, text or option we cannot use."""


class GateFailed(UserError):
    """A quality gate (--max-kl, --max-ppl-increase, --min-top1) was missed.

    `report` optionally carries the figures that missed (quantize --eval puts
    the manifest's would-be eval section there for its --json output)."""

    def __init__(self, message: str, hint: str | None = None, report: dict | None = None):
        super().__init__(message, hint)
        self.report = report
