"""End to end through Harbor's Trial API on the local sandbox: oracle 1.0 and do-nothing 0.0 on a few
suite tasks and on the converted / shimmed dialect fixtures; `reterm tasks check` with real builds."""

import asyncio
import json
from pathlib import Path

import pytest

from reterm.tasks import SUITE_DIR, load_task
from reterm.tasks.check import check_task
from reterm.tasks.verify import verify_tasks

FIXTURES = Path(__file__).parent / "fixtures" / "dialects"

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module", autouse=True)
def _sandbox_ready():
    from reterm.sandbox.preflight import missing_tools

    if missing := missing_tools():
        pytest.fail(f"the local sandbox needs {missing}: run scripts/setup.sh")


def _verify(dirs, out, **kw):
    loaded = [load_task(d) for d in dirs]
    return {r.name: r for r in asyncio.run(verify_tasks(loaded, out, n_concurrent=2, progress=False, **kw))}


def test_suite_tasks_oracle_and_null(tmp_path):
    # a service left running in the background, users and file ownership, a CLI tool
    names = ["start-health-service", "git-changelog-foreign-repo", "sqlite-import-csv"]
    results = _verify([SUITE_DIR / n for n in names], tmp_path)
    for name in names:
        r = results[name]
        assert (r.oracle.reward, r.nop.reward) == (1.0, 0.0), (name, r.trials)
        assert r.oracle.error is None and not r.shim


def test_dialects_oracle_and_null_offline(tmp_path):
    results = _verify([FIXTURES / "tb2-hello", FIXTURES / "tb1-word-count", FIXTURES / "termigen-csv-sum"],
                      tmp_path)  # fmt: skip
    # the verifiers download uv and pytest: they only work through the offline shim
    for name in ("tb2-hello", "tb1-word-count"):
        r = results[name]
        assert r.shim and (r.oracle.reward, r.nop.reward) == (1.0, 0.0), (name, r.trials)
        stdout = (Path(r.oracle.trial_dir) / "verifier" / "test-stdout.txt").read_text()
        assert "reterm shim: serving the uv installer offline" in stdout
        assert "1 passed" in stdout
    ctrf = Path(results["tb2-hello"].oracle.trial_dir) / "verifier" / "ctrf.json"
    assert '"passed": 1' in ctrf.read_text()
    # no solution: only the null agent runs
    r = results["termigen-csv-sum"]
    assert r.oracle.reward is None and r.oracle.error is None and r.nop.reward == 0.0 and r.ok


def test_check_builds_on_the_local_sandbox():
    ok = check_task(FIXTURES / "tb2-hello", build=True)
    assert ok.valid and ok.builds_locally and ok.build_s is not None
    assert ok.shim == ["downloads uv's installer", "runs uvx", "runs apt-get (offline: no mirror)"]
    bad = check_task(FIXTURES / "malformed" / "unsupported-base", build=True)
    assert bad.loads and bad.builds_locally is False and not bad.valid
    assert "environment/Dockerfile:1" in bad.build_error and "alpine" in bad.build_error


def test_verify_resumes_from_its_progress_file(tmp_path):
    """A second run into the same folder takes finished tasks from verify-progress.jsonl instead of running
    them again (no new trial folder), and runs only the task that was not finished."""
    from reterm.tasks.verify import PROGRESS, read_progress

    first = _verify([FIXTURES / "tb2-hello"], tmp_path)
    trials_before = sorted(p.name for p in (tmp_path / "trials").iterdir())
    assert len(trials_before) == 2 and set(read_progress(tmp_path / PROGRESS)) == {"tb2-hello"}
    with open(tmp_path / PROGRESS, "a") as fh:
        fh.write('{"name": "half-written')  # a run killed while writing: skipped
    again = _verify([FIXTURES / "tb2-hello", FIXTURES / "tb1-word-count"], tmp_path)
    assert again["tb2-hello"].trials == first["tb2-hello"].trials and again["tb2-hello"].ok
    assert again["tb1-word-count"].ok
    trials_after = sorted(p.name for p in (tmp_path / "trials").iterdir())
    assert len(trials_after) == 4 and set(trials_before) < set(trials_after)
    # a task named to run again (`reterm tasks verify --task NAME`) runs again, and its new record wins
    third = _verify([FIXTURES / "tb2-hello"], tmp_path, rerun=("tb2-hello",))
    assert third["tb2-hello"].ok and len(list((tmp_path / "trials").iterdir())) == 6
    lines = [json.loads(x) for x in (tmp_path / PROGRESS).read_text().splitlines() if x.startswith('{"name": "tb2-hello"')]
    assert len(lines) == 2 and read_progress(tmp_path / PROGRESS)["tb2-hello"].trials == third["tb2-hello"].trials
