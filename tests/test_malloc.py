"""reterm.malloc on this machine's glibc: after the call a 2 MiB block is a mapping of its own (given back
to the system when freed), where glibc's default, once a freed 8 MiB block has raised its threshold, serves
it from an arena. Each case runs in a fresh interpreter (the setting is per process and cannot be undone)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc only")

PROBE = """
import ctypes, sys
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
class MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks",
                                               "fsmblks", "uordblks", "fordblks", "keepcost")]
libc.mallinfo2.restype = MallInfo2
if sys.argv[1] == "bound":
    from reterm.malloc import bound_freed_memory
    assert bound_freed_memory() and bound_freed_memory()  # idempotent
p = libc.malloc(8 << 20); libc.free(p)
before = libc.mallinfo2().hblkhd
p = libc.malloc(2 << 20)
print((libc.mallinfo2().hblkhd - before) >> 20)
"""


def _mapped_mib(mode: str, env: dict[str, str] | None = None) -> int:
    proc = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True, cwd=REPO,
                          env={"PYTHONPATH": str(REPO), **(env or {})}, timeout=60)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return int(proc.stdout)


def test_large_blocks_are_mapped_and_returned_after_bound_freed_memory():
    assert _mapped_mib("default") == 0  # glibc's dynamic threshold: the block comes from the heap
    assert _mapped_mib("bound") == 2


def test_an_environment_setting_is_left_as_the_user_set_it():
    # MALLOC_MMAP_THRESHOLD_ fixes glibc's threshold itself (16 MiB here): the call changes nothing
    assert _mapped_mib("bound", {"MALLOC_MMAP_THRESHOLD_": str(16 << 20)}) == 0
