"""Outcome checks, acting as each user with runuser: create/modify/delete, group inheritance, modes."""
import grp
import os
import stat
import subprocess
import uuid

ROOT = "/srv/uploads"


def as_user(user, script):
    return subprocess.run(["runuser", "-u", user, "--", "bash", "-c", f"umask 002; {script}"],
                          capture_output=True, text=True, timeout=30)


def test_both_users_write_everywhere():
    web = grp.getgrnam("web").gr_gid
    for user in ("www", "deploy"):
        for sub in ("", "/2024"):
            name = f"{ROOT}{sub}/t-{user}-{uuid.uuid4().hex[:6]}"
            out = as_user(user, f"echo x > {name} && mkdir {name}.d && echo y > {name}.d/f")
            assert out.returncode == 0, (user, out.stderr)
            assert os.stat(name).st_gid == web, name
            assert os.stat(name + ".d").st_gid == web
            assert os.stat(name + ".d/f").st_gid == web
            other = "deploy" if user == "www" else "www"
            out = as_user(other, f"echo z >> {name} && rm -rf {name} {name}.d")
            assert out.returncode == 0, (other, out.stderr)


def test_existing_files_modifiable_by_group():
    for user in ("www", "deploy"):
        out = as_user(user, f"cat {ROOT}/2024/photo.jpg >/dev/null && echo more >> {ROOT}/logo.png")
        assert out.returncode == 0, (user, out.stderr)


def test_existing_entries_group_and_modes():
    web = grp.getgrnam("web").gr_gid
    for dirpath, dirs, files in os.walk(ROOT):
        for p in [dirpath] + [os.path.join(dirpath, f) for f in files]:
            st = os.lstat(p)
            assert st.st_gid == web, p
            mode = stat.S_IMODE(st.st_mode)
            assert mode & 0o060 == 0o060, (p, oct(mode))
            assert not mode & 0o002, (p, oct(mode))
            if stat.S_ISDIR(st.st_mode):
                assert mode & stat.S_ISGID, (p, oct(mode))
