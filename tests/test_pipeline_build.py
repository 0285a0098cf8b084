"""End to end: ``python -m reterm.data.build`` on a reduced config (scripted rollouts that fail for real,
error injection, the oracle-guided teacher, real sandboxes and verifiers), then

- the dataset loads with ``datasets.load_dataset(DIR)``, its stats agree with the shards, and a sample of
  records replayed in fresh sandboxes (prefix + recovery typed into a terminal, then the verifier) gets
  reward 1.0 (the replay here is written independently of the pipeline's own replay check);
- a build killed with SIGKILL at random points (at least 3) and resumed each time with the same command
  ends with exactly the records of the uninterrupted build, none duplicated.
"""

from __future__ import annotations

import json
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent

# Scripted rollouts: each fails for a reason the localiser names (jq missing; a stale lock).
CONFIG = {
    "name": "pipeline-test",
    "seed": 3,
    "sandbox_concurrency": 2,
    "tasks": {"path": "tasks", "names": ["replace-missing-jq", "stale-lock-nightly"]},
    "rollout": {
        "policy": "scripted",
        "scripts": {
            "replace-missing-jq": ["cd /app", "jq -r '.services[] | select(.enabled) | .name' services.json"],
            "stale-lock-nightly": ["cd /app", "/app/nightly.sh"],
        },
        "attempts": 1, "concurrency": 2, "max_turns": 4, "command_timeout": 10,
    },
    "injection": {"per_task": 2, "command_timeout": 10},
    "recovery": {"attempts": 2, "max_turns": 12},
    "dataset": {"name": "ReTerm-test"},
}  # fmt: skip


def _build(cfg: Path, out: Path, **kw) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "reterm.data.build", "--config", str(cfg), "--output", str(out)],
                            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, **kw)  # fmt: skip


def _rows(out: Path, sub: str = "data") -> list[dict]:
    import pyarrow.parquet as pq

    rows = []
    for p in sorted((out / sub).glob("*.parquet")):
        rows += pq.read_table(p).to_pylist()
    return sorted(rows, key=lambda r: r["id"])


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    base = tmp_path_factory.mktemp("pipeline")
    cfg = base / "config.yaml"
    cfg.write_text(yaml.safe_dump(CONFIG))
    out = base / "uninterrupted"
    t0 = time.monotonic()
    proc = _build(cfg, out)
    _, err = proc.communicate(timeout=1800)
    assert proc.returncode == 0, err[-3000:]
    return cfg, out, time.monotonic() - t0


@pytest.mark.slow
def test_build_loads_and_kept_recoveries_replay_to_reward_1(uninterrupted):
    import datasets
    from sandbox_support import run

    from reterm.agent.episode import run_verifier
    from reterm.agent.terminal import TerminalSession
    from reterm.data.dataset_stats import load_stats
    from reterm.sandbox.local import LocalEnvironment

    _, out, _ = uninterrupted
    ds = datasets.load_dataset(str(out))
    assert list(ds) == ["train"]
    train = ds["train"]
    stats = load_stats(out / "stats.json")
    # attempt-level states only: a perturbed run that still passes the verifier is no failure state
    assert stats.splits == {"train": train.num_rows} and train.num_rows >= 3
    assert set(train["target_attempt_index"]) == {2}
    cats = set(train["failure_category"])
    assert len(cats) >= 3, cats
    assert set(train["failure_source"]) == {"own", "injected"}
    assert all(r == 1.0 for r in train["verifier_reward"])
    assert len(set(train["id"])) == train.num_rows
    assert sum(c.records for c in stats.categories.values()) == train.num_rows
    import pyarrow.parquet as pq

    from reterm.record_features import FEATURES

    failed = pq.read_table(out / "failed_attempts" / "attempts-00000-of-00001.parquet")
    assert failed.column_names == list(FEATURES) and all(r == 0.0 for r in failed.column("verifier_reward").to_pylist())
    for name in ("report.md", "run_config.yaml", "versions.json", "plots/records_per_category.png",
                 "plots/recovery_rate_per_category.png", "plots/lengths.png"):  # fmt: skip
        assert (out / name).is_file(), name
    assert "| category |" in (out / "report.md").read_text()

    # replay a sample (one record per category) in fresh sandboxes, independently of the pipeline
    by_cat = {}
    for row in train:
        by_cat.setdefault(row["failure_category"], row)
    sample = [by_cat[c] for c in sorted(by_cat)][:4]

    async def replay(row):
        task = ROOT / "tasks" / row["task_id"]
        async with LocalEnvironment.for_task(task) as env:
            session = await TerminalSession.start(env)
            for k, m in enumerate(row["messages"]):
                for call in m["tool_calls"] if m["role"] == "assistant" else []:
                    if call["function"]["name"] == "bash":
                        args = json.loads(call["function"]["arguments"])
                        default = 10 if k < row["train_from_message_index"] else 30
                        await session.run(args["command"], timeout=args.get("timeout") or default)
            return (await run_verifier(env, task)).reward

    rewards = [run(replay(row)) for row in sample]
    assert rewards == [1.0] * len(sample), list(zip([r["id"] for r in sample], rewards))


def _progress(out: Path) -> int:
    """Units of work finished so far: unit files, finished Harbor trials, finished stages."""
    work = out / ".pipeline"
    n = len(list(work.glob("units/*/*.json")))
    n += len(list(work.glob("jobs/rollout/*/result.json")))
    try:
        n += sum(1 for v in json.loads((work / "journal.json").read_text()).values() if v.get("done"))
    except (OSError, ValueError):
        pass
    return n


@pytest.mark.slow
def test_sigkill_at_random_points_then_resume_gives_the_same_records(uninterrupted):
    cfg, ref, _ = uninterrupted
    total = _progress(ref)
    assert total >= 10
    out = ref.parent / "killed"
    rng = random.Random(20261129)
    targets = sorted(rng.sample(range(1, total - 1), 3))
    kills = []
    for target in targets:
        proc = _build(cfg, out)
        while proc.poll() is None and _progress(out) < target:
            time.sleep(0.05)
        time.sleep(rng.uniform(0.0, 0.3))
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            kills.append((target, _progress(out)))
        else:
            proc.communicate()
    assert len(kills) >= 3, kills
    print(f"SIGKILLed at (target, units done) = {kills} of {total} units")
    proc = _build(cfg, out)
    _, err = proc.communicate(timeout=1800)
    assert proc.returncode == 0, err[-3000:]
    got, want = _rows(out), _rows(ref)
    assert len({r["id"] for r in got}) == len(got), "duplicated records"
    assert [r["id"] for r in got] == [r["id"] for r in want]
    assert got == want
    assert _rows(out, "failed_attempts") == _rows(ref, "failed_attempts")
    # no record was produced twice along the way: one recovery unit per failure state, one trial per episode
    assert sorted(p.name for p in (out / ".pipeline/units/recovery").iterdir()) == \
        sorted(p.name for p in (ref / ".pipeline/units/recovery").iterdir())
    assert len(list((out / ".pipeline/jobs/rollout").glob("*/result.json"))) == \
        len(list((ref / ".pipeline/jobs/rollout").glob("*/result.json")))


# One scripted failed attempt per task, no injection, one recovery attempt per state: the release's
# attempt-level protocol through the whole build.
ATTEMPT_CONFIG = {
    **CONFIG,
    "name": "pipeline-attempt-level",
    "tasks": {"path": "tasks", "names": ["replace-missing-jq"]},
    "rollout": {**CONFIG["rollout"], "concurrency": 1},
    "injection": {"enabled": False},
    "recovery": {"attempts": 1, "max_turns": 12},
}


@pytest.fixture(scope="module")
def attempt_build(tmp_path_factory):
    """The reduced run: ``ATTEMPT_CONFIG`` built once (about 7 s); its folder and rows."""
    from reterm.data.build import build
    from reterm.data.config import PipelineConfig

    out = build(PipelineConfig.model_validate(ATTEMPT_CONFIG), tmp_path_factory.mktemp("attempt") / "out").output
    return out, _rows(out)


def test_build_writes_attempt_level_records_through_the_attempt_protocol(attempt_build):
    from reterm.agent.protocol import FEEDBACK_MESSAGE
    from reterm.record_features import FEATURES
    from reterm.records import RELEASE_COLUMNS
    from reterm.recovery.state import State

    _, rows = attempt_build
    assert rows, "the scripted failed attempt gave no record"
    assert list(FEATURES)[:6] == list(RELEASE_COLUMNS)
    for r in rows:
        assert list(r)[:6] == list(RELEASE_COLUMNS)
        assert r["target_attempt_index"] == 2
        k = r["train_from_message_index"]
        # the history is the whole failed attempt (both scripted commands, then submit), the feedback message
        # answering the submit; training starts at the first assistant turn after it
        assert r["messages"][k - 1]["content"] == FEEDBACK_MESSAGE
        assert r["messages"][k - 1]["role"] in ("tool", "user")
        assert r["messages"][k]["role"] == "assistant"
        assert "jq -r" in json.dumps(r["messages"][:k]) and r["failure_source"] == "own"
        state = State.from_record(r)
        assert state.level == "attempt" and state.id == r["trajectory_id"]


def test_a_reduced_runs_dataset_grpo_rollouts_eval_items_and_space_join_on_the_state_id(attempt_build, tmp_path):
    """The dataset of the reduced run, GRPO groups forked from its states (written as GRPO writes its
    rollouts), the eval's recovery attempts from its records and the Space's views of both name each state by
    one id: the records' ``trajectory_id``."""
    from sandbox_support import run
    from transformers import AutoTokenizer

    from reterm.eval import recovery
    from reterm.policies.scripted import ScriptedPolicy, submit_call
    from reterm.recovery.state import State
    from reterm.training.failure_pool import SnapshotCache, seed_states_from_records
    from reterm.training.grpo_outputs import rollout_rows
    from reterm.training.grpo_policy import TokenTrajectoryPolicy, scripted_generate_fn
    from reterm.training.grpo_rollout import RolloutEngine, RolloutSettings
    from reterm.training.models import resolve_model_name_or_path
    from reterm.trajectory import Trajectory

    sys.path.insert(0, str(ROOT / "space"))
    from replay_sources import group_key, open_source

    out, rows = attempt_build
    ids = {r["trajectory_id"] for r in rows}
    assert ids == {State.from_record(r).id for r in rows} and len(ids) == len(rows)

    # GRPO: the pool seeded from the dataset, one group of 2 attempts forked from each state
    seeds, skipped = seed_states_from_records(rows, [ROOT / "tasks"], exclude=set())
    assert {s.state_id for s in seeds} == ids and not skipped
    assert all(s.state.id == s.state_id and s.row()["state_source"] == "own" for s in seeds)
    tok = AutoTokenizer.from_pretrained(resolve_model_name_or_path("smollm2"))
    policy = TokenTrajectoryPolicy(tok, scripted_generate_fn(tok, lambda chain, messages: submit_call()),
                                   max_turn_tokens=32, max_completion_tokens=512)  # fmt: skip
    cache = SnapshotCache(4)
    engine = RolloutEngine(RolloutSettings(max_turns=2, environment="local", fork_method="snapshot"), cache=cache)
    try:
        groups = run(engine.run(policy, [(s, 2, k) for k, s in enumerate(seeds)]))
    finally:
        cache.close()
    assert all(g.dropped is None and len(g.attempts) == 2 for g in groups)
    rollouts = tmp_path / "grpo" / "rollouts"
    rollouts.mkdir(parents=True)
    grpo_rows = rollout_rows(groups, step=1, generation_round=1)
    (rollouts / "round-00001-step-00001-rank0.jsonl").write_text("\n".join(json.dumps(r) for r in grpo_rows) + "\n")
    assert {r["state_id"] for r in grpo_rows} == ids

    # eval: recovery attempts from the dataset's records (the eval's reader), one file per state and attempt
    states = recovery.states_from_records(out)
    assert {s.id for s in states} == ids
    evals = tmp_path / "eval"
    recovery.recover_from_states(ScriptedPolicy([], name="submit"), states, ROOT / "tasks", evals, attempts=1,
                                 max_turns=2)  # fmt: skip
    attempts = sorted(evals.glob("*.json"))
    assert {p.name.split("__")[0] for p in attempts} == ids
    items = [s.eval_item(Trajectory.load(p)) for s in states for p in attempts if p.name.startswith(s.id)]
    assert {i["state_id"] for i in items} == ids

    # the Space: the eval attempts open as one fan-out per state, the GRPO groups name their state
    space_eval = open_source(str(evals))
    assert {it.key for it in space_eval.items} == {f"group:{r['task_id']}/{r['trajectory_id']}" for r in rows}
    assert {group_key(Trajectory.load(p)).split("/")[1] for p in attempts} == ids
    space_grpo = open_source(str(rollouts))
    assert {next(i for i in ids if f"state {i}" in it.label) for it in space_grpo.items} == ids


def test_the_replay_check_drops_a_record_whose_replay_diverges(attempt_build):
    """The replay check rebuilds a record through materialize: a record whose prefix says a command succeeded
    that fails when typed again is reported as diverged (never scored), the true record replays to 1.0."""
    from sandbox_support import run

    from reterm.data.config import EnvironmentConfig
    from reterm.data.replay_check import replay_record

    _, rows = attempt_build
    row = rows[0]
    task = ROOT / "tasks" / row["task_id"]
    assert run(replay_record(row, task, EnvironmentConfig(type="local"), 10, 30)) == {"reward": 1.0, "error": None}
    messages = [dict(m) for m in row["messages"]]
    k = next(i for i, m in enumerate(messages) if m["role"] == "tool" and "[exit status: 127]" in (m["content"] or ""))
    messages[k]["content"] = messages[k]["content"].replace("[exit status: 127]", "[exit status: 0]")
    bad = run(replay_record({**row, "messages": messages}, task, EnvironmentConfig(type="local"), 10, 30))
    assert bad["reward"] is None and bad["error"].startswith("diverged: command 1 `jq -r"), bad
