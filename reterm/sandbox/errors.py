"""The sandbox's error types, at the bottom of :mod:`reterm.sandbox` so that every module of it
(:mod:`~reterm.sandbox.box`, :mod:`~reterm.sandbox.preflight`, :mod:`~reterm.sandbox.rootless`,
:mod:`~reterm.sandbox.local`) raises the same classes without importing one another."""

from __future__ import annotations


class SandboxError(RuntimeError):
    """The sandbox could not be started or has died (an infrastructure fault, not an agent failure)."""


class ExecTimeoutError(RuntimeError):
    """An exec ran past its timeout; its whole process tree was killed.

    Subclass of ``RuntimeError`` like Harbor's docker environment raises; carries what the command
    printed before it was killed in ``stdout`` / ``stderr`` (str).
    """

    def __init__(self, message: str, stdout: str = "", stderr: str = ""):
        super().__init__(message)
        self.stdout = stdout
        self.stderr = stderr
