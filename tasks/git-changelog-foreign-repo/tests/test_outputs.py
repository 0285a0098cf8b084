"""Outcome checks: changelog content, and the repository's ownership untouched."""
import os
import pwd
import subprocess


def test_changelog():
    out = subprocess.run(["git", "-c", "safe.directory=*", "-C", "/srv/repos/website", "log", "-5",
                          "--format=%H %s", "main"], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    want = "".join(f"{line[:7]} {line.split(' ', 1)[1]}\n" for line in out.stdout.splitlines())
    assert want.splitlines()[0].endswith(" release 2.3.0")
    with open("/app/changelog.txt") as fh:
        got = fh.read()
    assert got.rstrip("\n") + "\n" == want


def test_repository_still_owned_by_web():
    uid = pwd.getpwnam("web").pw_uid
    for dirpath, dirs, files in os.walk("/srv/repos/website"):
        for name in [dirpath] + [os.path.join(dirpath, f) for f in files]:
            assert os.lstat(name).st_uid == uid, name
    out = subprocess.run(["git", "-c", "safe.directory=*", "-C", "/srv/repos/website", "log", "--format=%s"],
                         capture_output=True, text=True)
    assert len(out.stdout.splitlines()) == 12
