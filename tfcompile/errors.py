"""Error types shared by every layer of tfcompile.

Every error a user can cause is a `UserError`: it names the file, tensor or
option at fault and carries a `hint` that says what to do. The CLI prints
`error: <message>` then `hint: <hint>` on stderr and exits 1. Anything else
that escapes is a bug and exits 2.
"""

from __future__ import annotations


class TfcompileError(Exception):
    """Base class. `hint` is one line telling the user what to do next."""

    exit_code = 2

    def __init__(self, message: str, hint: str | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        if self.hint:
            return f"{self.message}\nhint: {self.hint}"
        return self.message


class UserError(TfcompileError):
    """Bad input: a checkpoint, recipe, option or artifact the user gave us."""

    exit_code = 1


class CheckpointError(UserError):
    """A checkpoint directory, config.json or safetensors file is unusable."""


class RecipeError(UserError):
    """A recipe file or CLI flag is invalid."""


class FormatError(UserError):
    """A tensor cannot be encoded in the requested format (shape, NaN/Inf, dtype)."""


class VerifyError(UserError):
    """An artifact failed verification."""
