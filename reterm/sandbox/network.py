"""Which hosts a sandbox tried and failed to reach: a recorder of its DNS look-ups, and a reader of
the error messages programs print when a host cannot be reached.

Used to tell an infrastructure fault (a verifier, a reference solution or a build step that needs a host
this machine cannot reach) from an agent's failure, and to name the host (docs/SANDBOX.md, Network):

* :class:`LookupRecorder`: while a sandbox runs without a network, a small DNS responder listens on
  ``127.0.0.1:53`` *inside its network namespace* (glibc's resolver asks there when ``/etc/resolv.conf``
  names no server, as in every offline sandbox). It records each name asked for with the time, and answers
  ``REFUSED`` at once, so programs fail as fast as they did with no server at all ("Temporary failure in
  name resolution", curl's "Could not resolve host"). Names in ``/etc/hosts`` (``localhost``, the
  sandbox's host name) never reach it. Root mode only: a thread of this process joins the sandbox's
  network namespace to open the socket, which a rootless sandbox's user namespace does not allow.
* :func:`unreachable_hosts`: the host names in the messages of curl, wget, git, pip, uv, apt, npm and
  Python's socket errors, for output where no recorder ran (rootless mode, a sandbox on the host's
  network, build steps).

Own code: neither Harbor nor bubblewrap reports failed look-ups.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import selectors
import socket
import struct
import threading
import time
from collections.abc import Callable

logger = logging.getLogger(__name__)

DNS_PORT = 53
# Host names an offline sandbox looked up (JSON lines ``{"t": unix seconds, "host": name}``), in a Harbor trial's
# folder (written by :class:`reterm.sandbox.local.LocalEnvironment`, read by :mod:`reterm.agent.trial_outcome`).
NETWORK_LOG = "reterm-network.jsonl"
# Messages that name a host that could not be resolved or connected to (group 1: the host).
_HOST_PATTERNS: tuple[re.Pattern[str], ...] = tuple(
    re.compile(p)
    for p in (
        r"Could not resolve (?:host|proxy): ([A-Za-z0-9.-]+)",  # curl, git
        r"Failed to connect to ([A-Za-z0-9.-]+) port \d+",  # curl, git
        r"unable to resolve host address ['‘]([A-Za-z0-9.-]+)['’]",  # wget
        r"Temporary failure resolving '([A-Za-z0-9.-]+)'",  # apt
        r"Could not connect to ([A-Za-z0-9.-]+):\d+",  # apt
        r"(?:HTTPS?ConnectionPool|ProxyError)\(host='([A-Za-z0-9.-]+)'",  # pip, requests, urllib3
        r"(?:ENOTFOUND|EAI_AGAIN|ECONNREFUSED) ([A-Za-z0-9.-]+)",  # npm, node
        r"Failed to fetch: `https?://([A-Za-z0-9.-]+)",  # uv
        r"error sending request for url \(https?://([A-Za-z0-9.-]+)",  # uv, cargo (reqwest)
        r"dial tcp: lookup ([A-Za-z0-9.-]+)",  # go
        r"<urlopen error \[Errno -?\d+\] [^>]*> .*?https?://([A-Za-z0-9.-]+)",  # urllib with the URL after
        r"cannot open URL '(?:https?|ftp)://([A-Za-z0-9.-]+)",  # R (download.file, install.packages)
        r"unable to access index for repository (?:https?|ftp)://([A-Za-z0-9.-]+)",  # R (install.packages)
        r"URL '(?:https?|ftp)://([A-Za-z0-9.-]+)[^']*': status was 'Couldn't (?:resolve|connect)",  # R (libcurl)
        # opam runs curl and quotes its command line: exit 6 = host not resolved, 7 = no connection (curl(1))
        r"Curl failed: [^\n]{0,400}? -- (?:https?|ftp)://([A-Za-z0-9.-]+)[^\n]{0,200}?exited with code [67]\b",
    )
)
# Where the host of a failed look-up is named apart from the message that tells of the failure: the frames of a
# Python traceback as pytest prints them (http.client's ``host = 'github.com'``, urllib's request headers). Read
# only in a text that holds an anonymous failure (:data:`_ANONYMOUS`).
_CONTEXT_PATTERNS: tuple[re.Pattern[str], ...] = tuple(
    re.compile(p)
    for p in (
        r"\bhost = '([A-Za-z0-9.-]+)'",  # http.client / urllib.request frames (pytest's locals)
        r"'Host': '([A-Za-z0-9.-]+)'",  # urllib.request's headers
    )
)
# Failures that mean one known host was not reached, though no message names it: add-apt-repository asks
# Launchpad's API about a PPA and, when launchpadlib cannot connect, fails on the missing client
# (``self.lp.people``: AttributeError on None; Terminal-Bench 2.0 rstan-to-pystan, ppa:deadsnakes).
_IMPLIED_HOSTS: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"softwareproperties/ppa\.py\"[^\n]*\n(?:[^\n]*\n){0,12}?AttributeError: 'NoneType' object has no "
                r"attribute"), "api.launchpad.net"),
)
# Messages that say a name could not be resolved without naming it (Python's socket.gaierror, pip).
_ANONYMOUS = re.compile(
    r"Temporary failure in name resolution|Name or service not known|nodename nor servname provided|"
    r"No address associated with hostname|Network is unreachable"
)
# The sandbox's own addresses and names: a server the task (or its test) should have started there and did not
# is the task's business, not the network's (a test's own dead server on 0.0.0.0, its wildcard address).
_LOCAL_NAMES = {"localhost", "127.0.0.1", "::1", "sandbox", "", "0.0.0.0", "::", "ip6-localhost", "ip6-loopback"}


def unreachable_hosts(text: str) -> list[str]:
    """Host names that ``text`` (a program's output) reports as unresolvable or unreachable, in first-seen
    order; ``localhost`` and the sandbox's own names are left out (a server the task should have started is
    the task's business, not the network's). A host named only in a traceback's frames counts when the text
    also holds an anonymous look-up failure (``socket.gaierror: [Errno -2] Name or service not known``); a few
    failures imply their host without naming it (:data:`_IMPLIED_HOSTS`)."""
    seen: dict[str, None] = {}
    for pat, host in _IMPLIED_HOSTS:
        if pat.search(text):
            seen.setdefault(host, None)
    patterns = _HOST_PATTERNS + (_CONTEXT_PATTERNS if _ANONYMOUS.search(text) else ())
    for pat in patterns:
        for m in pat.finditer(text):
            host = m.group(1).strip(".").lower()
            if host not in _LOCAL_NAMES and not host.startswith("127.") and not host.endswith(".localhost"):
                seen.setdefault(host, None)
    return list(seen)


def mentions_unreachable(text: str) -> bool:
    """True when ``text`` holds a message of a failed name look-up or connection (named or not)."""
    return bool(unreachable_hosts(text)) or bool(_ANONYMOUS.search(text))


# ---------------------------------------------------------------------------------- DNS recorder
def parse_query(packet: bytes) -> tuple[int, str, bytes] | None:
    """``(id, name, question)`` of a DNS query packet (RFC 1035 §4.1), or None when it is not one.

    ``question`` is the raw question section (name, type and class), echoed back in the answer.
    """
    if len(packet) < 12:
        return None
    qid, flags, qdcount = struct.unpack("!HHH", packet[:6])
    if flags & 0x8000 or qdcount < 1:  # a response, or no question
        return None
    labels, i = [], 12
    while i < len(packet):
        n = packet[i]
        if n == 0:
            i += 1
            break
        if n & 0xC0 or i + 1 + n > len(packet):  # compression pointers do not occur in a question
            return None
        labels.append(packet[i + 1 : i + 1 + n].decode("ascii", errors="replace"))
        i += 1 + n
    else:
        return None
    if i + 4 > len(packet):
        return None
    return qid, ".".join(labels).lower(), packet[12 : i + 4]


def refused_answer(qid: int, question: bytes, rd: bool = True) -> bytes:
    """A DNS answer with rcode REFUSED (5) for the query ``qid`` with ``question``."""
    flags = 0x8000 | (0x0100 if rd else 0) | 5
    return struct.pack("!HHHHHH", qid, flags, 1, 0, 0, 0) + question


class LookupRecorder:
    """DNS responders inside sandboxes' network namespaces, one thread for all of this process's sandboxes.

    :meth:`watch` opens a UDP socket on ``127.0.0.1:53`` in a network namespace (an open ``/proc/PID/ns/net``
    descriptor) and calls ``on_lookup(name, time)`` for every name queried there; :meth:`unwatch` closes it.
    """

    def __init__(self) -> None:
        self._sel = selectors.DefaultSelector()
        self._lock = threading.Lock()
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        self._sel.register(self._wake_r, selectors.EVENT_READ, None)
        self._thread = threading.Thread(target=self._loop, name="reterm-dns-recorder", daemon=True)
        self._thread.start()

    def watch(self, netns_fd: int, on_lookup: Callable[[str, float], None]) -> socket.socket:
        """Start answering and recording look-ups in the network namespace ``netns_fd``.

        Returns the socket (give it to :meth:`unwatch`).

        Raises:
            OSError: the namespace cannot be joined (not root) or port 53 is taken there.
        """
        sock = _socket_in_netns(netns_fd)
        sock.setblocking(False)
        with self._lock:
            self._sel.register(sock, selectors.EVENT_READ, on_lookup)
        os.write(self._wake_w, b"x")
        return sock

    def unwatch(self, sock: socket.socket) -> None:
        """Stop recording on ``sock`` and close it (idempotent)."""
        with self._lock, contextlib.suppress(KeyError, ValueError):
            self._sel.unregister(sock)
        sock.close()

    def _loop(self) -> None:
        while True:
            for key, _ in self._sel.select(timeout=1.0):
                if key.data is None:
                    with contextlib.suppress(BlockingIOError):
                        os.read(self._wake_r, 4096)
                    continue
                sock: socket.socket = key.fileobj  # type: ignore[assignment]
                try:
                    packet, addr = sock.recvfrom(4096)
                except (BlockingIOError, OSError):
                    continue
                q = parse_query(packet)
                if q is None:
                    continue
                qid, name, question = q
                with contextlib.suppress(OSError):
                    sock.sendto(refused_answer(qid, question, rd=bool(packet[2] & 1)), addr)
                try:
                    key.data(name, time.time())
                except Exception:  # noqa: BLE001 - a recorder callback must not stop the thread
                    logger.exception("DNS recorder callback failed")


def _socket_in_netns(netns_fd: int) -> socket.socket:
    """A UDP socket bound to ``127.0.0.1:53`` in the network namespace ``netns_fd``.

    ``setns`` changes the calling thread only, so a short-lived thread joins the namespace, opens the
    socket (which stays in that namespace) and ends.
    """
    out: dict = {}

    def work() -> None:
        try:
            os.setns(netns_fd, os.CLONE_NEWNET)
            s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            s.bind(("127.0.0.1", DNS_PORT))
            out["sock"] = s
        except OSError as exc:
            out["error"] = exc

    t = threading.Thread(target=work, name="reterm-netns-socket")
    t.start()
    t.join()
    if "error" in out:
        raise out["error"]
    return out["sock"]


_recorder: LookupRecorder | None = None
_recorder_lock = threading.Lock()


def recorder() -> LookupRecorder:
    """The process's :class:`LookupRecorder` (started on first use)."""
    global _recorder
    with _recorder_lock:
        if _recorder is None:
            _recorder = LookupRecorder()
        return _recorder
