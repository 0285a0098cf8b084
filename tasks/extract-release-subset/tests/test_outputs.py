"""Outcome checks: exactly bin/ and lib/ under /opt/project, contents and modes from the archive."""
import os
import stat
import tarfile

ROOT = "/opt/project"


def _archive_members():
    want = {}
    with tarfile.open("/data/release-1.4.2.tar.xz") as tf:
        for m in tf.getmembers():
            parts = m.name.split("/", 1)
            if len(parts) == 2 and m.isfile() and parts[1].split("/")[0] in ("bin", "lib"):
                want[parts[1]] = (m.mode & 0o777, tf.extractfile(m).read())
    return want


def _installed_files():
    got = {}
    for dirpath, _dirs, files in os.walk(ROOT):
        for f in files:
            full = os.path.join(dirpath, f)
            got[os.path.relpath(full, ROOT)] = full
    return got


def test_exact_file_set():
    assert os.path.isdir(ROOT)
    assert sorted(_installed_files()) == sorted(_archive_members())


def test_contents_and_modes():
    want = _archive_members()
    got = _installed_files()
    for rel, (mode, data) in want.items():
        assert rel in got, rel
        st = os.stat(got[rel])
        assert stat.S_IMODE(st.st_mode) == mode, f"{rel}: {oct(stat.S_IMODE(st.st_mode))} != {oct(mode)}"
        with open(got[rel], "rb") as fh:
            assert fh.read() == data, rel
