"""pipeline/: config, task selection, perturbations, the oracle-guided teacher, filters, journal and
records, on real task folders and real trajectories of the schema (no sandbox; fast)."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import yaml

from reterm.agent.protocol import SYSTEM_PROMPT, parse_action
from reterm.data import filters, inject
from reterm.data.config import ConfigError, FiltersConfig, PipelineConfig, TasksConfig, load_config
from reterm.data.recover import WorkItem
from reterm.data.state import ConfigMismatchError, Journal
from reterm.data.tasks import select_tasks
from reterm.data.teacher import OracleGuidedTeacher, prefix_messages, resume_position
from reterm.data.write import make_record, records_from_unit
from reterm.recovery import localise
from reterm.tasks import load_splits, solution_steps
from reterm.trajectory import Action, Outcome, Step, Trajectory

ROOT = Path(__file__).resolve().parent.parent
TASKS = ROOT / "tasks"


def _step(i: int, command: str, observation: str = "(no output)\n[exit status: 0]", status: int | None = 0,
          **kw) -> Step:  # fmt: skip
    return Step(index=i, model_text="", action=Action(tool="bash", command=command), observation=observation,
                exit_status=status, **kw)  # fmt: skip


def _submit(i: int) -> Step:
    return Step(index=i, model_text="", action=Action(tool="submit"))


# -------------------------------------------------------------------------------------- config
def test_shipped_configs_load():
    smoke = load_config(ROOT / "pipeline/configs/smoke.yaml")
    assert smoke.rollout.policy == "smollm2" and smoke.recovery.policy == "oracle-guided"
    assert smoke.tasks.split == "train" and smoke.rollout.environment.type == "local"
    big = load_config(ROOT / "pipeline/configs/reterm-10k.yaml")
    assert big.rollout.policy.startswith("openai:") and big.recovery.policy.startswith("openai:")
    assert big.rollout.environment.type == "daytona" and big.recovery.rebuild == "replay"
    assert load_config().fingerprint() == smoke.fingerprint()  # the embedded default is the smoke recipe


def test_config_errors_name_file_and_field(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text(yaml.safe_dump({"rollout": {"attempst": 2}}))
    with pytest.raises(ConfigError, match=r"c\.yaml: rollout\.attempst"):
        load_config(p)
    p.write_text(yaml.safe_dump({"rollout": {"policy": "scripted"}}))
    with pytest.raises(ConfigError, match="scripts"):
        load_config(p)
    p.write_text(yaml.safe_dump({"injection": {"kinds": ["typo"]}}))
    with pytest.raises(ConfigError, match="unknown injection kind"):
        load_config(p)
    cfg = load_config(ROOT / "pipeline/configs/smoke.yaml", {"rollout.attempts": 5, "tasks.max_tasks": 1})
    assert cfg.rollout.attempts == 5 and cfg.tasks.max_tasks == 1


def test_tasks_never_include_the_evaluation_split(tmp_path):
    splits = load_splits()
    chosen = select_tasks(TasksConfig(path=TASKS))
    assert {t.id for t in chosen} == set(splits["train"])
    assert not {t.id for t in chosen} & set(splits["test"])
    assert all(t.license == "apache-2.0" for t in chosen)
    # a split file that puts an evaluation task into the train split is refused
    bad = dict(splits, train=splits["train"] + [splits["test"][0]])
    (tmp_path / "splits.json").write_text(json.dumps(bad))
    with pytest.raises(ConfigError, match="evaluation split"):
        select_tasks(TasksConfig(path=TASKS, split_file=tmp_path / "splits.json"))
    with pytest.raises(ConfigError, match="match no task"):
        select_tasks(TasksConfig(path=TASKS, names=[splits["test"][0]]))


# -------------------------------------------------------------------------------- perturbations
def test_perturbations_of_a_reference_solution():
    rng = random.Random(0)
    cmds = ["cd /app", "dpkg -i /opt/packages/x.deb", "mkdir -p /app/out", "python3 -m pytest -q tests",
            "cat > /app/m.py <<'PY'\ndef f(x):\n    if x <= 3:\n        return x + 1\n    return True\nPY",
            "setsid nohup python3 -m http.server 8000 >/dev/null 2>&1 &", "tar --strip-components=1 -xf a.tar"]
    mis = inject.misspelt_command(cmds, rng)
    assert all(p.commands[p.step] != cmds[p.step] and p.commands[: p.step] == tuple(cmds[: p.step]) for p in mis)
    assert any(p.commands[p.step].startswith(("dkpg", "dpgk")) for p in mis)
    flags = {p.step: p.commands[p.step] for p in inject.wrong_flag(cmds, rng)}
    assert flags[2] == "mkdir --recursive /app/out" and flags[3].startswith("python3 --module pytest")
    assert flags[6].startswith("tar --strip-") and "--strip-components" not in flags[6]
    deps = inject.removed_dependency(cmds, rng)
    dropped = [p for p in deps if len(p.commands) == len(cmds) - 1]
    assert dropped[0].step == 1 and "dpkg" not in " ".join(dropped[0].commands)
    assert any(p.commands[p.step].startswith("python -m pytest") for p in deps)
    (bug,) = inject.bug_in_file(cmds, rng)
    assert bug.step == 4 and bug.commands[4] != cmds[4] and bug.commands[4].split("\n")[0] == cmds[4].split("\n")[0]
    (hang,) = inject.foreground_hang(cmds, rng)
    assert hang.commands[5] == "python3 -m http.server 8000"
    paths = inject.wrong_path(cmds, rng)
    assert paths[0].commands[0] == "cd /ap" or paths[0].commands[0].startswith("cd /")


def test_choose_is_seeded_and_spreads_over_kinds():
    steps = solution_steps(TASKS / "fix-duration-parser")
    traj = Trajectory(task_id="fix-duration-parser", instruction="", system_prompt="",
                      steps=[_step(i, c) for i, c in enumerate(steps)], metadata={"rollout_id": "t1"})
    kinds = ["bug_in_file", "removed_dependency", "wrong_flag", "wrong_path", "misspelt_command"]
    a = inject.choose(traj, kinds, 4, seed=0)
    assert a == inject.choose(traj, kinds, 4, seed=0)
    assert [p.kind for p in a] == kinds[:4]
    assert len({p.commands for p in a}) == 4


# -------------------------------------------------------------------------------------- teacher
def _failure_state(task: str, history: list[Step], outcome=Outcome.FAILURE):
    traj = Trajectory(task_id=task, instruction="do it", system_prompt=SYSTEM_PROMPT, steps=history,
                      reward=0.0 if outcome is Outcome.FAILURE else None, outcome=outcome,
                      metadata={"rollout_id": "abc"})  # fmt: skip
    return localise(traj).primary


def test_oracle_guided_teacher_diagnoses_then_continues_the_solution():
    task = "install-internal-deb"
    solution = solution_steps(TASKS / task)  # cd /app; dpkg -i ...; logstat ...; cat ...
    state = _failure_state(task, [_step(0, "cd /app"),
                                  _step(1, "logstat --by status /var/log/app/access.log",
                                        "bash: logstat: command not found\n[exit status: 127]", 127), _submit(2)])
    assert state.category == "missing_dependency" and state.step == 1
    assert resume_position(solution, state) == 1  # `cd /app` already ran
    teacher = OracleGuidedTeacher({task: TASKS / task})
    plan = teacher.register(state, "do it")
    assert plan.commands == tuple(solution[1:])
    conv = prefix_messages("do it", state)
    first = parse_action(teacher.reply(conv))
    assert first.action.command == solution[1]
    assert "Diagnosis (missing dependency)" in first.content and "logstat: command not found" in first.content
    # the next turns depend only on the conversation: the turns after the prefix
    conv2 = conv + [{"role": "assistant", "content": "", "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "bash", "arguments": json.dumps({"command": solution[1]})}}]},
        {"role": "tool", "tool_call_id": "c", "name": "bash", "content": "ok"}]
    assert parse_action(teacher.reply(conv2)).action.command == solution[2]
    assert teacher.generate([conv, conv2], [])[1].text == teacher.reply(conv2)
    with pytest.raises(ValueError, match="no registered failure prefix"):
        teacher.reply(prefix_messages("another instruction", state))


def test_teacher_skips_a_failing_probe_the_solution_also_runs():
    task = "stale-lock-nightly"
    solution = solution_steps(TASKS / task)  # cd /app; /app/nightly.sh (fails: stale lock); cat lock; ...
    state = _failure_state(task, [_step(0, "cd /app"), _step(1, "/app/nightly.sh",
                                  "nightly: another run is in progress; giving up\n[exit status: 1]", 1), _submit(2)])
    assert solution[1] == "/app/nightly.sh" and resume_position(solution, state) == 2


# -------------------------------------------------------------------------------------- records
def _attempt(task: str, prefix: list[Step], recovery: list[Step], reward: float) -> Trajectory:
    steps = [s.model_copy(update={"from_history": True}) for s in prefix] + recovery
    t = Trajectory(task_id=task, instruction="do it", system_prompt=SYSTEM_PROMPT, policy="oracle-guided",
                   steps=steps, prefix_len=len(prefix))  # fmt: skip
    t.set_reward(reward)
    return t


def test_records_point_at_the_recovery_and_have_stable_ids():
    task = "install-internal-deb"
    prefix = [_step(0, "cd /app"), _step(1, "logstat x", "bash: logstat: command not found\n[exit status: 127]", 127)]
    state = _failure_state(task, prefix + [_submit(2)])
    item = WorkItem(state, "do it", "own", "smollm2", 15.0)
    ok = _attempt(task, state.history, [_step(2, "dpkg -i /opt/packages/l.deb"), _step(3, "logstat x"), _submit(4)], 1.0)
    bad = _attempt(task, state.history, [_step(2, "apt-get install logstat", "E: no\n[exit status: 100]", 100), _submit(3)], 0.0)
    infra = _attempt(task, state.history, [], 0.0)
    infra.outcome = Outcome.SANDBOX_ERROR
    unit = {"state_id": state.id, "status": "ok", "attempts": [a.model_dump(mode="json") for a in (ok, bad, infra)]}
    from reterm.data.tasks import task_info

    rows, failed = records_from_unit(item, unit, task_info(TASKS / task), per_state=1)
    (r,), (f,) = rows, failed
    assert r["messages"][r["train_from_message_index"]]["role"] == "assistant"
    assert json.loads(r["messages"][r["train_from_message_index"]]["tool_calls"][0]["function"]["arguments"])["command"].startswith("dpkg")
    assert r["messages"][r["train_from_message_index"] - 1]["content"].startswith("bash: logstat")
    assert (r["attempts"], r["successful_attempts"], r["recovery_turns"]) == (2, 1, 3)  # infra not counted
    assert r["failure_category"] == "missing_dependency" and r["failure_source"] == "own"
    assert r["replay_commands"] == ["cd /app", "logstat x"] and r["task_license"] == "apache-2.0"
    assert f["verifier_reward"] == 0.0 and r["verifier_reward"] == 1.0
    assert make_record(item, ok, task_info(TASKS / task), 2, 1)["id"] == r["id"]
    from datasets import Dataset

    from reterm.record_features import FEATURES

    assert Dataset.from_list([r, f], features=FEATURES).num_rows == 2


# -------------------------------------------------------------------------------------- filters
def _record(rid: str, task: str, prefix: list[str], recovery: list[str], category: str = "wrong_command",
            instruction: str = "Fix the report script so it prints every enabled service.") -> dict:  # fmt: skip
    def call(c):
        return {"role": "assistant", "content": "", "tool_calls": [{"id": "c", "type": "function", "function": {
            "name": "bash", "arguments": json.dumps({"command": c})}}], "tool_call_id": "", "name": ""}

    def tool(o):
        return {"role": "tool", "content": o, "tool_calls": [], "tool_call_id": "c", "name": "bash"}

    msgs = [{"role": "system", "content": "s", "tool_calls": [], "tool_call_id": "", "name": ""},
            {"role": "user", "content": instruction, "tool_calls": [], "tool_call_id": "", "name": ""}]
    for c in prefix:
        msgs += [call(c), tool("out")]
    start = len(msgs)
    for c in recovery:
        msgs += [call(c), tool("out")]
    return {"id": rid, "task_id": task, "instruction": instruction, "messages": msgs, "train_from_message_index": start,
            "recovery_turns": len(recovery), "replay_commands": prefix, "failure_category": category,
            "failure_command": prefix[-1], "failure_output": "bash: x: command not found\n[exit status: 127]"}


def test_quality_filter_reasons():
    cfg = FiltersConfig(max_recovery_turns=5, max_repeats=2)
    assert filters.quality_problem(_record("a", "t", ["ls", "x"], ["fix", "check"]), cfg) is None
    assert filters.quality_problem(_record("a", "t", ["ls"], ["c"] * 6), cfg) == "too_many_turns"
    assert filters.quality_problem(_record("a", "t", ["ls"], ["make", "make", "make"]), cfg) == "repetition"
    assert filters.quality_problem(_record("a", "t", ["cd /app", "ls", "bad"], ["cd /app", "ls", "good"]), cfg) == \
        "restart_from_scratch"
    assert filters.quality_problem(_record("a", "t", ["cd /app", "ls", "bad"], ["cd /app", "ls", "good"]),
                                   FiltersConfig(drop_restarts=False)) is None
    r = _record("a", "t", ["ls"], ["fix"])
    r["messages"].insert(r["train_from_message_index"] + 1, {"role": "user", "content": "[parse error]", "tool_calls": [],
                                                   "tool_call_id": "", "name": ""})
    assert filters.quality_problem(r, cfg) == "parse_errors"
    assert filters.quality_problem(_record("a", "t", ["ls"], ["x" * 200]), FiltersConfig(max_chars=100)) == "too_long"


def test_duplicates_and_near_duplicates():
    base = ["cd /app", "python3 fix.py --input data/a.csv --output out/a.csv", "python3 -m pytest -q tests"]
    a = _record("a", "t1", ["ls", "jq . x"], base)
    b = _record("b", "t1", ["ls", "jq . x"], base[:1] + ["python3 fix.py --input data/b.csv --output out/b.csv"] + base[2:])
    c = _record("c", "t1", ["ls", "jq . x"], base, category="missing_dependency")  # same commands, other category
    d = _record("d", "t2", ["ls", "jq . x"], ["cat /etc/os-release", "apt-get install -y jq"])
    res = filters.apply_filters([a, dict(a), b, c, d], FiltersConfig(near_duplicate_threshold=0.6),
                                filters.Decontaminator([], 8, 0.5))  # fmt: skip
    assert sorted(r["id"] for r in res.kept) == ["a", "c", "d"]
    assert res.counts == {"quality": 0, "dedup": 2, "decontamination": 0}
    assert res.removed["b"]["reason"] == "near duplicate of a"


def test_decontamination_by_name_instruction_and_commands():
    tb = filters.EvalTask("terminal-bench:2.0", "fix-git", "Your git repository lost two commits after a hard reset; "
                          "recover them and put them back on the main branch without rewriting history.",
                          "cd /app/repo\ngit reflog\ngit cherry-pick HEAD@{1}")  # fmt: skip
    dc = filters.Decontaminator([tb], ngram=5, threshold=0.5)
    assert dc.problem(_record("a", "fix-git", ["ls"], ["x"])).startswith("task name")
    same_text = _record("b", "other", ["ls"], ["x"], instruction="Recover them and put them back on the main "
                        "branch without rewriting history, please.")  # fmt: skip
    assert dc.problem(same_text).startswith("instruction overlaps terminal-bench:2.0:fix-git")
    assert dc.problem(_record("c", "other", ["cd /app/repo"], ["git reflog", "git cherry-pick HEAD@{1}"])).startswith(
        "commands overlap")
    assert dc.problem(_record("d", "other", ["ls"], ["make"])) is None
    res = filters.apply_filters([same_text, _record("d", "other", ["ls"], ["make"])], FiltersConfig(), dc)
    assert res.counts["decontamination"] == 1 and [r["id"] for r in res.kept] == ["d"]


# -------------------------------------------------------------------------------------- journal
def test_journal_refuses_another_config_and_resumes_the_same(tmp_path):
    cfg = PipelineConfig()
    j = Journal(tmp_path)
    assert j.bind_config(cfg.resolved(), cfg.fingerprint()) is False
    j.write_unit("recovery", "abc", {"x": 1})
    j.finish("rollout", {"episodes": 3})
    assert Journal(tmp_path).bind_config(cfg.resolved(), cfg.fingerprint()) is True
    assert j.done("rollout") and not j.done("recovery") and j.units("recovery") == ["abc"]
    other = cfg.model_copy(update={"seed": 7})
    with pytest.raises(ConfigMismatchError, match=r"seed: 0 -> 7"):
        Journal(tmp_path).bind_config(other.resolved(), other.fingerprint())
    assert Journal(tmp_path).bind_config(other.resolved(), other.fingerprint(), fresh=True) is False
    assert Journal(tmp_path).units("recovery") == [] and not Journal(tmp_path).done("rollout")
    assert not list(tmp_path.glob(".pipeline/**/*.tmp"))


def test_cli_reports_bad_configs(tmp_path, capsys):
    from reterm.cli import main as reterm_main
    from reterm.data.build import main

    bad = tmp_path / "bad.yaml"
    bad.write_text("tasks: {split: nope}\n")
    assert main(["--config", str(bad), "--output", str(tmp_path / "out")]) == 2
    assert "no task list under split 'nope'" in capsys.readouterr().err
    assert reterm_main(["data", "build", "--config", str(bad), "--output", str(tmp_path / "out2")]) == 2
    assert main(["--config", str(bad), "--output", str(tmp_path / "out"), "--set", "seed"]) == 2
    assert "KEY=VALUE" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()  # nothing written for a config that cannot run


def test_terminal_bench_copy_is_read_for_decontamination(tmp_path):
    from reterm.data.tasks import benchmark_tasks

    for name, text in [("fix-git", "Recover the lost commits of the repository in /app/repo after a hard reset."),
                       ("hello-world", "Write hello world into /app/hello.txt and nothing else at all.")]:
        (tmp_path / "tb" / name / "solution").mkdir(parents=True)
        (tmp_path / "tb" / name / "instruction.md").write_text(text)
        (tmp_path / "tb" / name / "solution" / "solve.sh").write_text("echo 'hello world' > /app/hello.txt\n")
    found = benchmark_tasks(tmp_path / "tb")
    assert [t.id for t in found] == ["fix-git", "hello-world"]
    dc = filters.Decontaminator([filters.eval_task_from_folder("terminal-bench:2.0", t.path) for t in found], 8, 0.5)
    assert dc.benchmarks == ["terminal-bench:2.0"]
    leaked = _record("x", "mine", ["ls"], ["echo hi"], instruction="Please write hello world into /app/hello.txt "
                     "and nothing else at all.")  # fmt: skip
    assert "hello-world" in dc.problem(leaked)
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match="no task folders"):
        benchmark_tasks(tmp_path / "empty")


def test_recovery_policies_from_the_config():
    from reterm.data.teacher import load_recovery_policy
    from reterm.policies.endpoint import EndpointPolicy
    from reterm.policies.scripted import OraclePolicy

    tasks = {"install-internal-deb": TASKS / "install-internal-deb"}
    assert isinstance(load_recovery_policy("oracle-guided", {}, tasks, "smollm2", {}), OracleGuidedTeacher)
    assert isinstance(load_recovery_policy("oracle", {}, tasks, "smollm2", {}), OraclePolicy)
    teacher = load_recovery_policy("openai:teacher", {"base_url": "http://127.0.0.1:9/v1"}, tasks, "smollm2", {})
    assert isinstance(teacher, EndpointPolicy)
    with pytest.raises(ValueError, match="needs a model policy"):
        load_recovery_policy("self", {}, tasks, "scripted", {})


def test_held_out_split_takes_whole_tasks_deterministically():
    # dataset.held_out_tasks: records of whole train tasks form the `test` split that SFT's held-out
    # likelihood check reads; the choice is seeded and never empties `train`
    import pyarrow.parquet as pq

    from reterm.data.write import held_out_task_ids, split_records

    rows = sorted(pq.read_table(ROOT / "tests/fixtures/reterm10k_mini/data/train-00000-of-00001.parquet").to_pylist(),
                  key=lambda r: r["id"])  # fmt: skip
    tasks = sorted({r["task_id"] for r in rows})
    assert len(tasks) >= 3
    cfg = PipelineConfig.model_validate({"seed": 5, "dataset": {"held_out_tasks": 1}})
    parts = split_records(rows, cfg)
    assert set(parts) == {"train", "test"} and len(parts["train"]) + len(parts["test"]) == len(rows)
    held = {r["task_id"] for r in parts["test"]}
    assert len(held) == 1 and not held & {r["task_id"] for r in parts["train"]}
    assert held_out_task_ids(list(reversed(rows)), 1, 5) == sorted(held)  # same choice whatever the order
    assert held_out_task_ids(rows, 99, 5) == sorted(held_out_task_ids(rows, 99, 5)) and \
        len(held_out_task_ids(rows, 99, 5)) == len(tasks) - 1  # at least one task stays in train
    assert split_records(rows, PipelineConfig()) == {"train": rows}  # default: no held-out split
