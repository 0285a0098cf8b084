"""Which trial phases failed for want of the network, from what a trial folder holds; and the exception
the local sandbox raises so that Harbor records such a fault instead of a reward of 0.

One rule, read by two callers:

* :class:`reterm.sandbox.local.LocalEnvironment` right after the verifier's ``test.sh`` ran: when the reward
  it wrote is below 1 and :func:`phase_network_fault` names hosts or packages, it raises
  :class:`NetworkUnreachableError`. Harbor's ``Trial.run`` records the exception in ``result.json``
  (``exception_info``, type ``NetworkUnreachableError``, the message naming the hosts) and never parses the
  reward, so ``harbor run`` / ``harbor view`` show a fault, not a silent 0 (Harbor 0.26: ``Trial.run`` ->
  ``_record_exception``; an exception raised inside ``Verifier.verify`` leaves ``verifier_result`` unset).
* :func:`reterm.agent.trial_outcome.network_fault` when a result is read back (other environments, older
  job folders).

Evidence per phase (``verifier``, and ``solution`` for Harbor's ``oracle`` agent), only where the phase's
network policy was ``public`` (the task asked for the internet and the trial could not give it; a
``no-network`` phase that looks a host up is the task's or the agent's business): host names the offline
sandbox recorded as looked up (``<trial>/`` :data:`reterm.sandbox.network.NETWORK_LOG`), hosts named by error
messages in the phase's output (:func:`reterm.sandbox.network.unreachable_hosts`), and for the verifier the
packages the offline shim could not install (``verifier/`` :data:`reterm.sandbox.shim.MISSING_LOG`). Hosts do
not count for the verifier when its CTRF report shows that tests ran and none failed for want of a host
(a look-up on the way, such as ``apt-get update``, did not decide the reward); missing packages count unless
the verifier's output says the writable layer was full (:func:`verifier_install_storage_fault`).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from reterm.sandbox.network import NETWORK_LOG, mentions_unreachable, unreachable_hosts
from reterm.sandbox.shim import MISSING_LOG


class NetworkUnreachableError(RuntimeError):
    """A verifier or reference solution failed for want of a host (or of a package the offline shim could
    not install) that its ``public`` phase asked for: an infrastructure fault, not the agent's failure.

    The message is :func:`phase_network_fault`'s (``"verifier could not reach: pypi.org"``). Harbor records
    it in ``result.json`` as ``exception_info`` with no reward; :mod:`reterm.agent.trial_outcome` reads it as
    ``network_error``."""


class StandInBaseError(RuntimeError):
    """A verifier or reference solution failed because the local sandbox's base stands in for the task's image
    and lacks what the task's script pins: an infrastructure fault, not the agent's failure.

    The local sandbox builds every ``FROM debian|ubuntu|python`` image on a Debian root made from today's mirror
    (:func:`reterm.sandbox.dockerfile.map_base_image`), so ``apt-get install r-base-core=4.3.3-2build2`` (an
    Ubuntu version) or ``ca-certificates=20250419`` (the version a ``debian:13.0`` image shipped) has no
    candidate there, where under Docker the image provides it. The message is :func:`phase_base_fault`'s
    (``"solution asks apt for what the stand-in base lacks: r-base-core=4.3.3-2build2"``). Harbor records it in
    ``result.json``; :mod:`reterm.agent.trial_outcome` reads it as ``sandbox_error``."""


# apt's messages for a package or version the configured archive does not have (apt-get(8), Debian 12/13)
_APT_MISSING: tuple[re.Pattern[str], ...] = (
    re.compile(r"^E: Version '([^']+)' for '([^']+)' was not found", re.M),
    re.compile(r"^E: Unable to locate package (\S+)", re.M),
    re.compile(r"^E: Package '([^']+)' has no installation candidate", re.M),
)


def apt_missing(text: str) -> list[str]:
    """Packages (``name`` or ``name=version``) that apt said its archive lacks in ``text``, first-seen order."""
    seen: dict[str, None] = {}
    for m in _APT_MISSING[0].finditer(text):
        seen.setdefault(f"{m.group(2)}={m.group(1)}", None)
    for pat in _APT_MISSING[1:]:
        for m in pat.finditer(text):
            seen.setdefault(m.group(1), None)
    return list(seen)


def phase_base_fault(phases: list[tuple[str, Path]]) -> str | None:
    """Why task-owned phases (``solution``, ``verifier``) failed on the local sandbox's stand-in base, or
    ``None``: the packages apt could not find in each phase's output (:func:`apt_missing`).

    Only the task's own scripts count (the reference solution and ``test.sh``, which pass under Docker on the
    task's image); what an agent asks apt for is the agent's business. Returns e.g. ``"solution asks apt for
    what the stand-in base lacks: wget=1.21.4-1ubuntu4.1"``; phases joined by ``"; "``."""
    reasons = []
    for phase, output in phases:
        missing = apt_missing(read_text(output))
        if missing:
            reasons.append(f"{phase} asks apt for what the stand-in base lacks: {', '.join(missing)}")
    return "; ".join(reasons) or None


class WritableLayerFullError(RuntimeError):
    """The reference solution ran out of the local sandbox's writable layer: an infrastructure fault.

    The local sandbox keeps a trial's writes in a size-limited tmpfs that counts against its memory
    (:func:`reterm.sandbox.local.effective_storage_mb`), where Docker gives a container the host's disk; a
    solution that installs large packages (Terminal-Bench 2.0's gcode-to-text: opencv, matplotlib, tesseract)
    can pass there and fail here with ``[Errno 28] No space left on device``. The reference solution counts
    (:func:`phase_storage_fault`), and the verifier's own package install when the agent had left the layer at
    most half full (:func:`verifier_install_storage_fault`): what an agent writes until the layer is full is the
    agent's failure.
    :mod:`reterm.agent.trial_outcome` reads it as ``sandbox_error``."""


_ENOSPC = re.compile(r"No space left on device")


def phase_storage_fault(solution_output: Path, storage_mb: int) -> str | None:
    """``"solution ran out of the sandbox's writable layer (N MiB, held in memory, ...)"`` when the reference
    solution's output holds ``No space left on device`` (ENOSPC), else ``None``."""
    if not _ENOSPC.search(read_text(solution_output)):
        return None
    return (f"solution ran out of the sandbox's writable layer ({storage_mb} MiB, held in memory, where Docker gives "
            "a container the host's disk): give the trial more with --ek storage_mb=... memory_mb=...")  # fmt: skip


def verifier_install_storage_fault(verifier_output: Path, missing_log: Path, storage_mb: int,
                                   used_at_start_mb: float | None) -> str | None:
    """``"verifier's package install ran out of the sandbox's writable layer ..."`` when the verifier's packages
    could not be installed (the shim's missing log lists them) and its output holds ``No space left on device``,
    while the layer was at most half full when the verifier started; else ``None``.

    Terminal-Bench 2.0's torch tasks ask uvx for ``torch==2.7.0``, about 4 GB installed with its CUDA wheels: it
    fits Docker's disk but not a layer of 3 GiB held in memory. The half-full rule keeps the blame where it
    belongs: an agent that left the layer more than half full when the verifier began made the room that was
    missing, and its trial stays scored (:func:`phase_network_fault` then does not call the packages a network
    fault either).

    Args:
        verifier_output: the verifier's ``test-stdout.txt``.
        missing_log: the shim's :data:`reterm.sandbox.shim.MISSING_LOG` in the trial's ``verifier/``.
        storage_mb: the writable layer's size (MiB).
        used_at_start_mb: MiB in use in the layer when the verifier started (``None``: not measured, no fault).
    """
    missing = shim_missing(missing_log)
    if not missing or used_at_start_mb is None or used_at_start_mb > storage_mb / 2:
        return None
    if not _ENOSPC.search(read_text(verifier_output)):
        return None
    return (f"verifier's package install ran out of the sandbox's writable layer ({storage_mb} MiB, held in memory, "
            f"where Docker gives a container the host's disk, {used_at_start_mb:.0f} MiB in use when the verifier "
            f"started): {', '.join(missing)} (give the trial more with --ek storage_mb=... memory_mb=...)")  # fmt: skip


def shim_missing(missing_log: Path) -> list[str]:
    """The packages the verifier shim could not install (``apt:NAME`` / ``python:NAME``), sorted, once each, from
    its :data:`reterm.sandbox.shim.MISSING_LOG`; ``[]`` when there is none."""
    return sorted(set(read_text(missing_log).split()))


def read_text(path: Path, limit: int = 4 << 20) -> str:
    """The first ``limit`` characters of a file, ``""`` when it cannot be read."""
    try:
        with open(path, errors="replace") as fh:
            return fh.read(limit)
    except OSError:
        return ""


def ctrf_clears_network(path: Path) -> bool:
    """True when the verifier's CTRF report (``--ctrf``, as Terminal-Bench 2.0 verifiers write it; the offline
    shim's plugin too) shows that tests ran and that no failing test's message tells of an unreachable host."""
    try:
        tests = json.loads(read_text(path))["results"]["tests"]
    except (ValueError, KeyError, TypeError):
        return False
    if not isinstance(tests, list) or not tests:
        return False
    failed = [t for t in tests if isinstance(t, dict) and t.get("status") == "failed"]
    return not any(mentions_unreachable(json.dumps(t)) for t in failed)


def _host_of(name: str) -> str:
    """The host a looked-up name is about: a service record's labels (``_http._tcp.deb.debian.org``, apt's SRV
    look-up) dropped."""
    labels = name.split(".")
    while len(labels) > 1 and labels[0].startswith("_"):
        labels = labels[1:]
    return ".".join(labels)


def _network_log(trial_dir: Path) -> tuple[list[tuple[float, str, str]], list[tuple[float, str]]]:
    lookups: list[tuple[float, str, str]] = []
    policies: list[tuple[float, str]] = []
    for line in read_text(trial_dir / NETWORK_LOG).splitlines():
        try:
            rec = json.loads(line)
            t = float(rec["t"])
        except (ValueError, KeyError, TypeError):
            continue
        if "host" in rec:
            lookups.append((t, _host_of(str(rec["host"])), str(rec.get("policy", "public"))))
        elif "policy" in rec:
            policies.append((t, str(rec["policy"])))
    return lookups, sorted(policies)


def phase_network_fault(
    trial_dir: str | Path, phases: list[tuple[str, tuple[float, float] | None, Path]]
) -> str | None:
    """Why phases of a trial lacked the network they asked for, naming hosts and packages, or ``None``.

    Args:
        trial_dir: the Harbor trial folder (holds :data:`NETWORK_LOG` and ``verifier/``).
        phases: ``(name, (start, end) unix seconds or None, output file)``; ``name`` is ``"solution"`` or
            ``"verifier"`` (only the verifier reads the CTRF report and the shim's missing packages).

    Returns e.g. ``"verifier could not reach: astral.sh, pypi.org"``; phases joined by ``"; "``. A trial folder
    without the log (another environment) counts every phase as ``public``.
    """
    trial_dir = Path(trial_dir)
    lookups, policies = _network_log(trial_dir)

    def policy_at(t: float) -> str:
        current = "public"
        for when, policy in policies:
            if when <= t:
                current = policy
        return current

    cleared = ctrf_clears_network(trial_dir / "verifier" / "ctrf.json")
    reasons = []
    for phase, window, output in phases:
        if window is None or policy_at(window[0]) != "public":
            continue
        hosts: dict[str, None] = {}
        for t, host, policy in lookups:
            if window[0] <= t <= window[1] and policy == "public":
                hosts.setdefault(host, None)
        for host in unreachable_hosts(read_text(output)):
            hosts.setdefault(host, None)
        missing: list[str] = []
        if phase == "verifier":
            if cleared:  # the tests ran, and none failed for want of a host
                hosts = {}
            # packages that did not fit the writable layer are not the network's (verifier_install_storage_fault)
            if not _ENOSPC.search(read_text(output)):
                missing = shim_missing(trial_dir / "verifier" / MISSING_LOG)
        if hosts:
            reasons.append(f"{phase} could not reach: {', '.join(hosts)}")
        if missing:
            reasons.append(f"{phase} needs what the offline shim could not install: {', '.join(missing)}")
    return "; ".join(reasons) or None


def written_reward(verifier_dir: Path) -> float | None:
    """The verifier's reward as written to ``reward.txt`` (a number) or ``reward.json`` (its ``reward`` key, or
    its only value); ``None`` when absent or unreadable (Harbor then raises its own reward-file error)."""
    text = read_text(verifier_dir / "reward.txt").strip()
    if text:
        try:
            return float(text)
        except ValueError:
            return None
    try:
        data = json.loads(read_text(verifier_dir / "reward.json"))
    except ValueError:
        return None
    if isinstance(data, dict):
        value = data.get("reward", next(iter(data.values())) if len(data) == 1 else None)
    else:
        value = data
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None
