"""The offline verifier shim's files and where a sandbox mounts them (the verifier phase of a trial).

What the shim is: the files in ``reterm/sandbox/shim/`` (read its README.md): stand-ins for ``curl`` (uv's
installer URL only), ``uv``/``uvx``, ``apt-get``/``apt`` and the ``pytest-json-ctrf`` option, which run
Terminal-Bench style verifiers (that download uv and pytest) against the pytest preinstalled in the
sandbox. How it is wired, with no change to the task, to test.sh or to how the reward is computed:

1. :func:`shim_dir` copies the files once to ``<cache>/sandbox/shim/<hash>`` (the checkout itself is
   never mounted into a sandbox);
2. the folder is bind-mounted read-only at :data:`SHIM_TARGET` and ``BASH_ENV`` names its ``activate.sh``
   in the **verifier's** environment only. Bash sources ``BASH_ENV`` when it runs a script, so test.sh (a
   bash script) finds the shim first on its PATH; the agent phase never has ``BASH_ENV``.
   :class:`reterm.sandbox.local.LocalEnvironment` does both in every Harbor trial (option
   ``verifier_shim``, on by default); :func:`shim_trial_settings` gives the same as Harbor trial settings
   for other environments.

What the shim could not provide (a package it cannot install) is listed in
``/logs/verifier/`` :data:`MISSING_LOG`; :mod:`reterm.agent.trial_outcome` makes such a failed trial an
infrastructure fault naming it.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from reterm.io import build_once, content_hash
from reterm.sandbox.paths import sub

SHIM_SOURCE = Path(__file__).parent / "shim"
SHIM_TARGET = "/opt/reterm-shim"
SHIM_BASH_ENV = f"{SHIM_TARGET}/activate.sh"
MISSING_LOG = "reterm-shim-missing.txt"


def shim_dir() -> Path:
    """The shim's files, copied once to ``<cache>/sandbox/shim/<content hash>`` (made in one rename, so
    concurrent callers never see half a folder). Returns the folder to mount."""
    def copy(tmp: Path) -> None:
        shutil.copytree(SHIM_SOURCE, tmp, symlinks=True, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))

    return build_once(copy, sub("shim") / content_hash(SHIM_SOURCE))


def shim_trial_settings() -> tuple[list[dict], dict[str, str]]:
    """Harbor settings that activate the shim for one trial on an environment that honours bind mounts
    (the local sandbox applies it by itself).

    Returns:
        ``(mounts, verifier_env)``: add ``mounts`` to ``TrialConfig.environment.mounts`` and
        ``verifier_env`` to ``TrialConfig.verifier.env``.
    """
    mount = {"type": "bind", "source": str(shim_dir()), "target": SHIM_TARGET, "read_only": True}
    return [mount], {"BASH_ENV": SHIM_BASH_ENV}
