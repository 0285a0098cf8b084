"""Checks run before a sandbox starts, so that it fails with a message saying what is missing
instead of half-starting.
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
from pathlib import Path

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


def userns_status() -> dict[str, str | bool]:
    """What an unprivileged user would need for a user-namespace sandbox, measured on this host.

    Keys: ``userns`` (can create a user namespace), ``overlay_in_userns`` (kernel >= 5.11),
    ``subuid`` (a /etc/subuid range for the user), ``newuidmap`` (uidmap package),
    ``detail`` (one line per missing piece).
    """
    user = pwd.getpwuid(os.geteuid()).pw_name
    status: dict[str, str | bool] = {}
    try:
        r = subprocess.run(["unshare", "--user", "--map-root-user", "true"], capture_output=True, text=True, timeout=10)
        status["userns"] = r.returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        status["userns"] = False
    major, minor = (int(x) for x in os.uname().release.split(".")[:2])
    status["overlay_in_userns"] = (major, minor) >= (5, 11)
    status["newuidmap"] = bool(shutil.which("newuidmap")) and bool(shutil.which("newgidmap"))
    try:
        status["subuid"] = any(
            line.split(":")[0] in (user, str(os.geteuid())) for line in Path("/etc/subuid").read_text().splitlines()
        )
    except OSError:
        status["subuid"] = False
    detail = []
    if not status["userns"]:
        detail.append("unprivileged user namespaces are disabled (sysctl user.max_user_namespaces / "
                      "kernel.unprivileged_userns_clone, or an AppArmor restriction)")  # fmt: skip
    if not status["overlay_in_userns"]:
        detail.append(f"kernel {os.uname().release} is older than 5.11 (no overlayfs inside a user namespace)")
    if not status["newuidmap"]:
        detail.append("newuidmap/newgidmap are missing (Debian package `uidmap`)")
    if not status["subuid"]:
        detail.append(f"no subordinate uid range for {user} in /etc/subuid and /etc/subgid "
                      f"(e.g. `{user}:100000:65536`)")  # fmt: skip
    status["detail"] = "; ".join(detail)
    return status


def require_capabilities_or_explain() -> None:
    """Raise :class:`SandboxError` when running as root without the capabilities the sandbox needs
    (e.g. inside an unprivileged container)."""
    from reterm.sandbox.box import SandboxError

    if missing := missing_capabilities():
        raise SandboxError(
            f"the local sandbox runs as root but this process lacks {', '.join(missing)} (mount namespaces, "
            "overlayfs and user switching need them; an unprivileged container drops them). Run it on the host "
            "or in a privileged container. Nothing was started."
        )


def require_root_or_explain() -> None:
    """Raise :class:`SandboxError` explaining what a non-root caller is missing.

    The sandbox runs as real root (CI and these machines). Without root it would need a user
    namespace with a full uid map (so that the base's files owned by root, _apt, ... stay
    distinct and apt/chown work inside) plus overlayfs inside that namespace. This version
    implements the root mode only; the message lists what this host has and lacks for the
    user-namespace mode and how to run instead.
    """
    from reterm.sandbox.box import SandboxError

    user = pwd.getpwuid(os.geteuid()).pw_name
    st = userns_status()
    have = [k for k in ("userns", "overlay_in_userns", "newuidmap", "subuid") if st[k]]
    raise SandboxError(
        f"the local sandbox needs root (running as {user}, uid {os.geteuid()}). "
        "Run the command with sudo, or use another Harbor environment (-e docker / podman). "
        "A rootless mode would need a user namespace with a full uid map; on this host: "
        f"present: {', '.join(have) or 'nothing'}; missing: {st['detail'] or 'nothing'}. "
        "Nothing was started."
    )
