"""Outcome checks: the job works as svc (rerun here too), output owned by svc, no widened modes."""
import json
import os
import pwd
import stat
import subprocess


def test_result_written_by_svc():
    uid = pwd.getpwnam("svc").pw_uid
    st = os.stat("/var/lib/myapp/result.json")
    assert st.st_uid == uid
    with open("/var/lib/myapp/result.json") as fh:
        assert json.load(fh) == {"region": "eu-west", "batch": 250, "processed": 1000, "status": "ok"}
    assert os.stat("/var/log/myapp/job.log").st_uid == uid


def test_job_runs_again_as_svc():
    out = subprocess.run(["runuser", "-u", "svc", "--", "python3", "/app/job.py"],
                         capture_output=True, text=True, timeout=60, cwd="/")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "job done"


def test_no_world_access_added():
    mode = stat.S_IMODE(os.stat("/etc/myapp/settings.ini").st_mode)
    assert not mode & 0o007, oct(mode)
    for d in ("/var/log/myapp", "/var/lib/myapp", "/etc/myapp"):
        for dirpath, _dirs, files in os.walk(d):
            for p in [dirpath] + [os.path.join(dirpath, f) for f in files]:
                assert not stat.S_IMODE(os.lstat(p).st_mode) & 0o002, p
