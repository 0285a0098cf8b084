"""Generation split over processes (:mod:`reterm.workers`), with real processes: every chunk is claimed by exactly
one worker, lines appended to a shared journal by several processes stay whole, and the stages that use them
(``eval.mechanism --workers``, ``pipeline.drills --workers``) give each task once, resume, and write what a
single process writes."""

from __future__ import annotations

import json
import multiprocessing as mp
import subprocess
import sys

import pytest

from reterm import workers
from reterm.data import drills as data_drills
from reterm.drills import generate_drills
from reterm.drills.multistage import add_train_instances, generate_multistage
from reterm.eval import mechanism


def _claim_all(folder, names, go, out):
    claims = workers.Claims(folder)
    go.wait(30)
    out.put([n for n in names if claims.take(n)])


def test_each_chunk_is_claimed_by_exactly_one_process(tmp_path):
    names = [f"chunk-{i}" for i in range(300)] + ["own-multi:hf:/a/b_c#0", "own-multi:hf:/a/b/c#0", "x" * 400]
    ctx = mp.get_context("fork")
    q, go = ctx.Queue(), ctx.Event()
    procs = [ctx.Process(target=_claim_all, args=(tmp_path / "claims", names, go, q)) for _ in range(4)]
    for p in procs:
        p.start()
    go.set()  # all four race for the same chunks at once
    got = [q.get(timeout=60) for _ in procs]
    for p in procs:
        p.join()
    taken = [n for g in got for n in g]
    assert sorted(taken) == sorted(names)  # every chunk once, none twice (names that differ only in / or : too)
    workers.Claims.reset(tmp_path / "claims")
    assert workers.Claims(tmp_path / "claims").take("chunk-0")  # a new set of workers starts from none


def test_a_line_torn_by_a_killed_writer_spoils_only_itself(tmp_path):
    path = tmp_path / "journal.jsonl"
    workers.append_lines(path, [json.dumps({"task": "a"})])
    with open(path, "a") as f:
        f.write('{"task": "b", "rewards": [1.0, ')  # a worker killed in the middle of its line
    workers.append_lines(path, [json.dumps({"task": "c"}), json.dumps({"task": "d"})])
    rows, torn = workers.read_lines(path)
    assert [r["task"] for r in rows] == ["a", "c", "d"] and torn == 1
    assert [r["task"] for r in mechanism.read_rows(path)] == ["a", "c", "d"]


def test_a_worker_ignores_ctrl_c_and_its_parent_stops_it(tmp_path):
    """Ctrl-C reaches the whole process group; a worker leaves it to its parent, which stops it with SIGTERM, so
    that its cleanup is not cut short by a second signal."""
    marker = tmp_path / "finished"
    code = ("import os, signal, time\nfrom reterm.workers import follow_parent\nfollow_parent()\n"
            f"os.kill(os.getpid(), signal.SIGINT)\ntime.sleep(0.3)\nopen({str(marker)!r}, 'w').write('ok')\n")
    assert workers.run_workers([("w", ["-c", code])], 1) == {}
    assert marker.read_text() == "ok"


def test_a_chunk_samples_the_same_whichever_worker_runs_it():
    import torch

    workers.reseed(0, "chunk-8")
    first = torch.rand(4)
    torch.rand(100)  # another chunk ran before it in this process
    workers.reseed(0, "chunk-8")
    assert torch.equal(torch.rand(4), first)
    workers.reseed(0, "chunk-16")
    assert not torch.equal(torch.rand(4), first)


def test_the_workers_default_comes_from_the_environment(monkeypatch):
    monkeypatch.delenv(workers.WORKERS_ENV, raising=False)
    assert workers.default_workers() == 1
    monkeypatch.setenv(workers.WORKERS_ENV, "2")
    assert workers.default_workers() == 2
    monkeypatch.setenv(workers.WORKERS_ENV, "two")
    with pytest.raises(ValueError, match="RETERM_GEN_WORKERS='two'"):
        workers.default_workers()


def test_an_append_waits_for_the_journal_lock_and_writes_whole_lines(tmp_path):
    """A journal line is written under an exclusive ``flock``: while another process holds it (here, the test), a
    worker's append waits; then its lines land whole."""
    import fcntl
    import time

    path = tmp_path / "journal.jsonl"
    line = json.dumps({"pad": "x" * 300_000})
    with open(path, "a") as held:
        fcntl.flock(held.fileno(), fcntl.LOCK_EX)
        proc = mp.get_context("fork").Process(target=workers.append_lines, args=(path, [line, line]))
        proc.start()
        time.sleep(1.0)
        assert path.stat().st_size == 0 and proc.is_alive()  # it waits for the lock
        fcntl.flock(held.fileno(), fcntl.LOCK_UN)
    proc.join(timeout=30)
    assert proc.exitcode == 0 and path.read_text().splitlines() == [line, line]


def test_worker_option_is_checked():
    assert workers.parse_worker("1/2") == (1, 2)
    for bad in ("2/2", "a/2", "1", "-1/2"):
        with pytest.raises(ValueError, match="--worker"):
            workers.parse_worker(bad)


def test_a_failing_worker_is_named_and_the_others_finish(tmp_path, capsys):
    ok = ["-c", f"open({str(tmp_path / 'ok')!r}, 'w').write('1')"]
    failed = workers.run_workers([("bad", ["-c", "raise SystemExit(3)"]), ("good", ok)], 2)
    assert failed == {"bad": 3} and (tmp_path / "ok").read_text() == "1"
    assert "bad: its worker exited with code 3" in capsys.readouterr().out


@pytest.mark.slow
def test_mechanism_in_two_processes_runs_every_task_once_and_resumes(tmp_path):
    """The real SmolLM2 on three chains in chunks of one task, two worker processes: each task's row once, every
    attempt's line whole, the summary says 2 workers; a re-run finds them done and starts no worker."""
    out = tmp_path / "m"
    args = [sys.executable, "-m", "eval.mechanism", "--model", "smollm2", "--output", str(out), "--chain-stages",
            "3", "--tasks", "3", "--group-size", "2", "--max-turns", "1", "--max-new-tokens", "16", "--batch", "2",
            "--workers", "2"]  # fmt: skip
    first = subprocess.run(args, capture_output=True, text=True)
    assert first.returncode == 0, first.stderr[-2000:]
    assert "2 worker processes of" in first.stdout
    rows = mechanism.read_rows(out / "groups.jsonl")
    assert sorted(r["task"] for r in rows) == ["chain3-000", "chain3-001", "chain3-002"]
    lines = [json.loads(x) for x in (out / "attempts.jsonl").read_text().splitlines()]
    assert len(lines) == sum(2 + (2 if r["failure_state"] else 0) for r in rows)
    assert sorted(p.read_text().split()[1] for p in (out / "claims").iterdir()) == ["chunk-0", "chunk-1", "chunk-2"]
    assert json.loads((out / "mechanism.json").read_text())["workers"] == 2
    again = subprocess.run(args, capture_output=True, text=True)
    assert again.returncode == 0 and "(3 done before)" in again.stdout and "worker processes" not in again.stdout
    assert len(mechanism.read_rows(out / "groups.jsonl")) == 3
    # killed after claiming chunks 0 and 1 and before their rows: the claims stay, the rows are missing; the
    # re-run's workers must not take those claims for work done
    kept = [x for x in (out / "groups.jsonl").read_text().splitlines()
            if json.loads(x)["task"] not in ("chain3-000", "chain3-001")]  # fmt: skip
    (out / "groups.jsonl").write_text("".join(x + "\n" for x in kept))
    (out / "mechanism.json").unlink()
    third = subprocess.run(args, capture_output=True, text=True)
    assert third.returncode == 0, third.stderr[-2000:]
    assert "(1 done before)" in third.stdout and "2 worker processes of" in third.stdout
    assert sorted(r["task"] for r in mechanism.read_rows(out / "groups.jsonl")) == ["chain3-000", "chain3-001",
                                                                                    "chain3-002"]  # fmt: skip
    assert json.loads((out / "mechanism.json").read_text())["n_tasks"] == 3


def test_a_worker_reads_the_drills_its_parent_wrote(tmp_path):
    with pytest.raises(FileNotFoundError, match="chain3-000"):
        generate_multistage(tmp_path / "tasks", 0, 1, stages=3, write=False)
    written = generate_multistage(tmp_path / "tasks", 0, 2, stages=3)
    assert generate_multistage(tmp_path / "tasks", 0, 2, stages=3, write=False) == written


@pytest.mark.slow
def test_data_in_two_processes_matches_one_process(tmp_path, capfd):
    """``pipeline.drills --workers 2`` with the real SmolLM2 on a few drills: both workers run batches and the
    parent none (it only writes the folder); the same journal keys and tasks as one process, none twice, and the
    same scripted records (the injected mistakes and whole solutions do not sample)."""
    tasks = tmp_path / "drills"
    generate_drills(tasks, 0, 4, families=["mkdir-parent", "exec-bit", "off-by-one", "wc-number"],
                    ood_families=["wc-number"])  # fmt: skip
    add_train_instances(tasks, 2, stages=3)
    outs = {}
    for w in (2, 1):
        out = tmp_path / f"data-{w}"
        rc = data_drills.main(["--tasks", str(tasks), "--output", str(out), "--policy", "smollm2", "--own-tasks", "4",
                               "--max-turns", "1", "--max-new-tokens", "16", "--batch", "2", "--workers", str(w)])
        assert rc == 0
        said = [x for x in capfd.readouterr().out.splitlines() if "batch" in x and x.startswith("[drills-data]")]
        if w == 2:
            assert any("worker 0/2:" in x for x in said) and any("worker 1/2:" in x for x in said), said
            assert all("worker" in x for x in said), said  # the parent ran no batch itself
        journal = [json.loads(x) for x in (out / ".drills" / "journal.jsonl").read_text().splitlines()]
        keys = [(e["key"], t) for e in journal for t in e["tasks"]]
        assert len(keys) == len(set(keys))  # no task of a kind twice
        scripted: dict[str, list[str]] = {}
        for e in journal:
            if not e["key"].startswith("own"):
                scripted.setdefault(e["key"], []).extend(r["id"] for r in e["records"])
        outs[w] = (sorted(keys), {k: sorted(v) for k, v in scripted.items()})
        assert json.loads((out / "stats.json").read_text())["splits"]["train"] > 0  # the folder is written once, here
    assert outs[2][0] == outs[1][0] and outs[2][1] == outs[1][1]


def test_a_stopped_worker_cleans_up_and_does_not_wait_for_a_generation_call(tmp_path):
    """SIGTERM to a worker while a thread runs a call that cannot be interrupted (a batched generation) and that
    the interpreter would wait for on its way out: its ``finally`` blocks run at once (snapshots are released
    there), and it ends after the grace period instead of when the call would have returned."""
    import os
    import signal
    import time

    marker = tmp_path / "cleaned"
    code = ("import threading, time\nfrom reterm.workers import follow_parent\nfollow_parent()\n"
            "threading.Thread(target=time.sleep, args=(300,)).start()\n"
            f"try:\n    print('busy', flush=True)\n    time.sleep(300)\nfinally:\n    open({str(marker)!r}, 'w').write('ok')\n")  # fmt: skip
    env = dict(os.environ, RETERM_WORKER_STOP_GRACE_S="2", **{workers.PARENT_ENV: str(os.getpid())})
    proc = subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "busy"
    t0 = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    try:
        rc = proc.wait(timeout=60)
    finally:
        proc.kill()
    assert rc == 128 + signal.SIGTERM and time.monotonic() - t0 < 30 and marker.read_text() == "ok"
