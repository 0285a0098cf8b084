"""End to end through Harbor's Trial API on the local sandbox: oracle 1.0 and do-nothing 0.0 on a few
suite tasks and on the converted / shimmed dialect fixtures; `reterm tasks check` with real builds."""

import asyncio
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


def _verify(dirs, out):
    loaded = [load_task(d) for d in dirs]
    return {r.name: r for r in asyncio.run(verify_tasks(loaded, out, n_concurrent=2, progress=False))}


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
