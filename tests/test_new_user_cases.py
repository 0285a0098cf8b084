"""Cases a new user hit while trying to break the kit: each was a bug, fixed, and is kept
here on the real parts (the local sandbox, the harness, the CLIs), seconds each.

- a model's command holding a NUL or a lone surrogate ended the episode as a *sandbox* fault;
- an agent's fork bomb in a small-memory sandbox made the kernel's OOM killer end the sandbox's
  holder, so the agent's own mistake read as an infrastructure fault;
- ``reterm run`` warned "allows internet access" for every no-network task, named neither file
  nor field for a bad ``task.toml``, and ran with ``--max-turns 0``; ``reterm tasks check`` of a
  missing path ended in a traceback;
- an eval config with a mistyped policy spec ran every trial as an infrastructure fault;
- ``reterm data build`` on a split holding a task the local sandbox cannot build ran the rollouts,
  then stopped with a traceback in the injection stage;
- ``space/app.py --source`` with a missing folder started the server anyway;
- ``train/sft.py`` with a recipe field TRL does not know ended in a traceback.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time

import pytest
from sandbox_support import HELLO_TASK, REPO, assert_box_cleaned

from reterm.agent.episode import run_episode
from reterm.agent.protocol import parse_action
from reterm.policies.scripted import ScriptedPolicy, bash_call
from reterm.sandbox.local import LocalEnvironment
from reterm.trajectory import Outcome

SOLVE = 'echo "Hello, world!" > /app/hello.txt'


def _call(command_json: str) -> str:
    return '<tool_call>{"name": "bash", "arguments": {"command": "%s"}}</tool_call>' % command_json


def test_nul_and_lone_surrogate_in_a_command_are_parse_errors_not_sandbox_faults():
    for raw in ("echo a\\u0000b", "echo a\\ud800b"):
        parsed = parse_action(_call(raw))
        assert parsed.action is None and parsed.outcome == "bad_argument", parsed
    replies = iter([_call("echo a\\u0000b"), _call("echo a\\ud800b"), bash_call(SOLVE)])

    async def body():
        env = LocalEnvironment.for_task(HELLO_TASK)
        async with env:
            return await run_episode(ScriptedPolicy(lambda m: next(replies, '<tool_call>{"name": "submit"}</tool_call>')),
                                     env, HELLO_TASK, max_turns=5)  # fmt: skip

    traj = asyncio.run(body())
    assert [s.parse_error for s in traj.steps[:2]] == ["bad_argument", "bad_argument"]
    assert "NUL" in traj.steps[0].observation
    assert traj.outcome is Outcome.SUCCESS and traj.reward == 1.0, (traj.outcome, traj.error)


def test_fork_bomb_out_of_memory_kills_the_bomb_not_the_sandbox():
    async def body():
        env = LocalEnvironment.for_task(HELLO_TASK, memory_mb=48, pids_max=256)
        await env.start(force_build=False)
        box = env.box
        ids = (box.id, list(box.cgroups.dirs.values()) if box.cgroups else [], box.rundir)
        try:
            if not box.cgroups or "memory" not in box.cgroups.dirs:
                pytest.skip("no memory cgroup: the OOM case cannot happen here")
            adj = await env.exec("cat /proc/self/oom_score_adj")
            assert adj.stdout.strip() == "1000"  # the agent's processes go first ...
            try:
                await env.exec(":(){ :|:& };:", timeout_sec=3)
            except Exception:
                pass
            deadline = time.monotonic() + 2.0
            while time.monotonic() < deadline and box.alive:
                await asyncio.sleep(0.1)
            assert box.alive, "the OOM killer ended the sandbox (its holder or init) instead of the bomb"
        finally:
            await env.stop(delete=True)
        return ids

    box_id, cgroups, rundir = asyncio.run(body())
    assert_box_cleaned(box_id, cgroups, rundir)


def test_reterm_run_bad_task_toml_names_the_file(tmp_path, capsys):
    from reterm.agent.cli import main

    task = tmp_path / "bad"
    (task / "environment").mkdir(parents=True)
    (task / "instruction.md").write_text("x\n")
    (task / "environment" / "Dockerfile").write_text("FROM debian:bookworm-slim\n")
    (task / "task.toml").write_text('[environment]\ncpus = "one"\n')
    assert main([str(task), "--policy", "oracle"]) == 2
    err = capsys.readouterr().err
    assert f"{task / 'task.toml'}: invalid task configuration" in err and "environment.cpus" in err
    (task / "task.toml").write_text("[task\n")
    assert main([str(task), "--policy", "oracle"]) == 2
    assert f"{task / 'task.toml'}: invalid TOML" in capsys.readouterr().err


def test_reterm_run_refuses_non_positive_limits_and_tasks_check_a_missing_path(capsys):
    from reterm.agent.cli import main as run_main
    from reterm.tasks.cli import main as tasks_main

    for flag, value in (("--max-turns", "0"), ("--time-budget", "-3"), ("--command-timeout", "nan")):
        assert run_main([str(HELLO_TASK), "--policy", "oracle", flag, value]) == 2
        assert f"{flag} must be positive" in capsys.readouterr().err
    assert run_main([str(HELLO_TASK), "--policy", "oracle", "--output", __file__]) == 2  # was a traceback
    assert "exists and is not a folder" in capsys.readouterr().err
    assert tasks_main(["check", "/nonexistent-reterm-tasks"]) == 2  # was a traceback
    assert "reterm tasks check: /nonexistent-reterm-tasks: not a directory" in capsys.readouterr().err


def test_reterm_run_environment_gets_the_tasks_network_policy(tmp_path):
    from harbor.models.task.config import NetworkMode
    from harbor.models.task.task import Task

    from reterm.agent.environments import make_environment

    env = make_environment("local", Task(HELLO_TASK), tmp_path / "trial")
    assert env._network_policy.network_mode == NetworkMode.NO_NETWORK  # was PUBLIC: a false warning


def test_eval_config_with_unknown_policy_spec_fails_at_load(tmp_path, capsys):
    from reterm.eval.run import main

    cfg = tmp_path / "eval.yaml"
    cfg.write_text("name: x\ndataset: {path: tasks, split: test}\nenvironment: {type: local}\n"
                   "models:\n  - {name: m, agent: reterm, policy: 'gpt:foo'}\n")  # fmt: skip
    out = tmp_path / "out"
    assert main(["--config", str(cfg), "--output", str(out)]) == 2
    err = capsys.readouterr().err
    assert "unknown policy spec 'gpt:foo'" in err and str(cfg) in err
    assert not out.exists()


def test_pipeline_refuses_a_task_the_local_sandbox_cannot_build_before_writing(tmp_path, capsys):
    import json
    import shutil

    from reterm.data.build import main

    tasks = tmp_path / "tasks"
    for name in ("ok", "alpine"):
        shutil.copytree(HELLO_TASK, tasks / name)
    (tasks / "alpine" / "environment" / "Dockerfile").write_text("FROM alpine:3.19\n")
    (tasks / "splits.json").write_text(json.dumps({"train": ["alpine", "ok"], "test": []}))
    out = tmp_path / "out"
    argv = ["--output", str(out), "--set", f"tasks.path={tasks}", "--set", "tasks.names=null",
            "--set", "tasks.eval_split=null", "--set", "rollout.policy=oracle", "--set", "rollout.policy_kwargs={}"]
    assert main(argv) == 2  # was a traceback in the injection stage, after the rollouts
    err = capsys.readouterr().err
    assert "1 of the 2 tasks cannot be used" in err
    assert f"{tasks / 'alpine' / 'environment' / 'Dockerfile'}:1: FROM alpine:3.19" in err
    assert not out.exists()


def test_space_refuses_a_missing_source_folder(tmp_path):
    missing = tmp_path / "no-such-run"
    r = subprocess.run([sys.executable, str(REPO / "space" / "app.py"), "--source", str(missing), "--port", "7999"],
                       capture_output=True, text=True, timeout=120, cwd=REPO)  # fmt: skip
    assert r.returncode == 2, r.stdout + r.stderr
    assert f"--source {missing}: no such file or folder" in r.stderr
    assert "Running on" not in r.stdout


@pytest.mark.slow
def test_sft_recipe_with_an_unknown_field_names_recipe_and_field(tmp_path):
    recipe = tmp_path / "sft.yaml"
    text = (REPO / "train" / "recipes" / "smollm2-135m" / "sft.yaml").read_text()
    assert "\nlearning_rate:" in text
    recipe.write_text(text.replace("\nlearning_rate:", "\nlearning_rat:"))
    r = subprocess.run([sys.executable, "train/sft.py", "--config", str(recipe), "--output_dir", str(tmp_path / "o")],
                       capture_output=True, text=True, timeout=300, cwd=REPO)  # fmt: skip
    assert r.returncode == 2, r.stderr[-2000:]
    assert f"sft.py: {recipe}: Unknown arguments" in r.stderr and "learning_rat" in r.stderr
    assert "Traceback" not in r.stderr
    assert not (tmp_path / "o").exists()
