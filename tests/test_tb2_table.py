"""scripts/tb2_table.py: the docs' Terminal-Bench 2.0 table from `reterm tasks verify` outputs written by the
verify module's own writers (verify.json, verify-progress.jsonl) over task folders with real Dockerfiles."""

import json
import os
import shutil
import sys
from pathlib import Path

from reterm.tasks.verify import PROGRESS, TaskVerification, TrialOutcome, verification_json

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))
import tb2_table  # noqa: E402

HELLO = REPO / "tests" / "fixtures" / "dialects" / "tb2-hello"


def _task(root: Path, name: str, dockerfile: str) -> Path:
    d = root / name
    shutil.copytree(HELLO, d)
    (d / "environment" / "Dockerfile").write_text(dockerfile)
    return d


def _runs(tmp_path: Path) -> tuple[Path, Path, Path]:
    tasks = tmp_path / "terminal-bench-2"
    hello = _task(tasks, "hello", (HELLO / "environment" / "Dockerfile").read_text())
    clone = _task(tasks, "clone", "FROM ubuntu:24.04\nRUN apt-get update\nRUN git clone https://github.com/a/b\n")
    net = _task(tasks, "net", "FROM --platform=linux/amd64 python:3.11-slim AS base\nFROM base\n")
    slow = _task(tasks, "slow", "FROM debian:13.0-slim\n")
    _task(tasks, "later", "FROM ubuntu:24.04\n")
    offline = tmp_path / "runs" / "offline"
    trials = offline / "trials"
    ok = TaskVerification("hello", str(hello), True, trials={
        "oracle": TrialOutcome("oracle", 1.0, 3.0, None, str(trials / "hello__oracle__a1"), "success"),
        "nop": TrialOutcome("nop", 0.0, 2.0, None, str(trials / "hello__nop__b2"), "failure")}, build_s=1.6)
    build = TaskVerification("clone", str(clone), True, build_s=20.2, build_error=(
        f"SandboxBuildFailedError: {clone}/environment/Dockerfile:3: RUN git clone https://github.com/a/b failed "
        "with exit code 128:\nfatal: unable to access 'https://github.com/a/b/': Could not resolve host: "
        "github.com\n(note: this step could not reach github.com: build steps use this machine's network)"))
    fault = "solution could not reach: deb.debian.org, pypi.org; verifier needs what the offline shim could not " \
            "install: python:numpy"
    network = TaskVerification("net", str(net), True, trials={
        "oracle": TrialOutcome("oracle", None, 9.0, f"NetworkUnreachableError: {fault}",
                               str(trials / "net__oracle__c3"), "network_error"),
        "nop": TrialOutcome("nop", None, 4.0, "NetworkUnreachableError: verifier needs what the offline shim could "
                            "not install: python:numpy", str(trials / "net__nop__d4"), "network_error")}, build_s=0.2)
    failed = TaskVerification("slow", str(slow), True, trials={
        "oracle": TrialOutcome("oracle", 0.0, 30.0, None, str(trials / "slow__oracle__e5"), "failure"),
        "nop": TrialOutcome("nop", 0.0, 5.0, None, str(trials / "slow__nop__f6"), "failure")}, build_s=0.4)
    offline.mkdir(parents=True)
    (offline / "verify.json").write_text(json.dumps(verification_json([ok, build, network], 60.0)))
    ctrf = trials / "slow__oracle__e5" / "verifier" / "ctrf.json"
    ctrf.parent.mkdir(parents=True)
    ctrf.write_text(json.dumps({"results": {"tool": {"name": "pytest"}, "summary": {"tests": 2, "passed": 1}, "tests": [
        {"name": "test_outputs.py::test_exists", "status": "passed"},
        {"name": "test_outputs.py::test_cancel_in_time", "status": "failed"}]}}))
    # a resumed run: its later tasks only in the progress file, one line cut off by a kill
    lines = [json.dumps(t) for t in verification_json([failed])["tasks"]] + ['{"name": "lat']
    (offline / PROGRESS).write_text("\n".join(lines) + "\n")
    os.utime(offline / "verify.json", (1, 1))  # older than the progress file
    host = tmp_path / "runs" / "host"
    host.mkdir()
    net_host = TaskVerification("net", str(net), True, trials={
        "oracle": TrialOutcome("oracle", 1.0, 20.0, None, str(host / "trials" / "net__oracle__g7"), "success"),
        "nop": TrialOutcome("nop", 0.0, 4.0, None, str(host / "trials" / "net__nop__h8"), "failure")}, build_s=0.1)
    (host / PROGRESS).write_text(json.dumps(verification_json([net_host])["tasks"][0]) + "\n")
    return tasks, offline, host


def test_table_rows_totals_and_relative_paths(tmp_path, capsys):
    tasks, offline, host = _runs(tmp_path)
    assert set(tb2_table.read_run(offline)) == {"hello", "clone", "net", "slow"}
    assert tb2_table.main([str(tasks), "--offline", str(offline), "--host", str(host)]) == 0
    out = capsys.readouterr().out
    rows = {line.split(" | ")[0][2:]: line for line in out.splitlines() if line.startswith("| ")}
    assert rows["hello"].startswith("| hello | `python:3.13-slim-bookworm` | ok 2 | 1.0 / 0.0 | 7 | ok | not run | - |")
    assert rows["clone"] == ("| clone | `ubuntu:24.04` | FAIL 20 | - / - | 20 | infra | not run | - | build: "
                             "Dockerfile:3 `RUN git clone https://github.com/a/b` exit 128: could not reach github.com |")
    assert rows["net"].startswith("| net | `python:3.11-slim` +1 stage | ok 0 | fault / fault | 13 | infra | "
                                  "1.0 / 0.0 | ok | solution could not reach: deb.debian.org, pypi.org (oracle); "
                                  "verifier needs what the offline shim could not install: python:numpy (oracle, nop) |")
    assert "| slow | `debian:13.0-slim` | ok 0 | 0.0 / 0.0 | 35 | FAIL |" in rows["slow"]
    assert "scored: oracle 0.0 (1 of 2 tests passed; failed: test_cancel_in_time)" in rows["slow"]
    assert rows["later"] == "| later | `ubuntu:24.04` | not run | not run | - | not run | not run | - |  |"
    assert "**Offline (default policy)** (4 of 5 tasks run): 1 ok, 2 infra, 0 refused, 1 FAIL" in out
    assert "the solution could not reach deb.debian.org 1, pypi.org 1;" in out
    assert "offline shim could not install: python:numpy 1." in out
    assert "by the host the step could not reach: github.com 1 (clone)" in out
    assert "(1 of 5 tasks run): 1 ok, 0 infra, 0 refused, 0 FAIL." in out
    assert str(tmp_path) not in out
