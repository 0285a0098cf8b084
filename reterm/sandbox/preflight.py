"""Checks run before a sandbox starts, so that it fails with a message saying what is missing
instead of half-starting.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from reterm.sandbox.errors import SandboxError
from reterm.sandbox.rootless import user_name

_TOOLS = {"bwrap": "bubblewrap", "unshare": "util-linux", "nsenter": "util-linux", "debootstrap": "debootstrap"}


def missing_tools() -> list[str]:
    """Host tools the sandbox needs that are not installed, as ``"tool (Debian package)"``."""
    path = "/usr/bin:/bin:/usr/sbin:/sbin:" + os.environ.get("PATH", "")
    return [f"{t} ({pkg})" for t, pkg in _TOOLS.items() if not shutil.which(t, path=path)]


CAP_SYS_ADMIN = 21
CAP_NAMES = {21: "CAP_SYS_ADMIN", 18: "CAP_SYS_CHROOT", 6: "CAP_SETGID", 7: "CAP_SETUID"}


def missing_capabilities() -> list[str]:
    """Capabilities the root mode needs (mount namespaces, overlayfs, pivot_root, uid switch) but this
    process does not have in its effective set."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("CapEff:"):
            eff = int(line.split()[1], 16)
            return [name for bit, name in CAP_NAMES.items() if not eff & (1 << bit)]
    return []


def require_capabilities_or_explain() -> None:
    """Raise :class:`SandboxError` when running as root without the capabilities the sandbox needs
    (e.g. inside an unprivileged container)."""
    if missing := missing_capabilities():
        raise SandboxError(
            f"the local sandbox runs as root but this process lacks {', '.join(missing)} (mount namespaces, "
            "overlayfs and user switching need them; an unprivileged container drops them). Run it on the host "
            "or in a privileged container, or try RETERM_SANDBOX_MODE=rootless (a user namespace). "
            "Nothing was started."
        )


def require_root_or_explain() -> None:
    """Raise :class:`SandboxError`: root mode was asked for (``RETERM_SANDBOX_MODE=root``) without root.

    Without that setting a non-root caller gets rootless mode (:mod:`reterm.sandbox.rootless`).
    """
    raise SandboxError(
        f"RETERM_SANDBOX_MODE=root needs root (running as {user_name()}): run it with sudo, or "
        "unset RETERM_SANDBOX_MODE to use rootless mode (unprivileged user namespaces). Nothing was started."
    )
