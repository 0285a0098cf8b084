"""The episode loop and the verifier runner on the real local sandbox: outcomes,
stop reasons, infrastructure faults, starting from a history in a fork, lock-step batches."""

from __future__ import annotations

import asyncio
import shutil
import time
from pathlib import Path

import pytest

from reterm.agent.atif import conversation_view, from_atif, from_messages, to_atif
from reterm.agent.episode import EpisodeSpec, run_episode, run_episodes, run_verifier
from reterm.policies.base import EndpointError, Generation
from reterm.policies.scripted import ScriptedPolicy, bash_call
from reterm.sandbox.local import LocalEnvironment
from reterm.trajectory import Outcome

TASK = Path(__file__).parent / "fixtures" / "tasks" / "hello-file"
SOLVE = 'echo "Hello, world!" > /app/hello.txt'


def run(coro):
    return asyncio.run(coro)


async def _episode(policy, task=TASK, **kwargs):
    env = LocalEnvironment.for_task(task)
    async with env:
        return await run_episode(policy, env, task, **kwargs)


def test_success_and_failure_are_judged_by_the_verifier():
    traj = run(_episode(ScriptedPolicy([SOLVE, "cat /app/hello.txt"])))
    assert traj.outcome is Outcome.SUCCESS and traj.reward == 1.0 and traj.stop_reason == "submitted"
    assert [s.command for s in traj.steps] == [SOLVE, "cat /app/hello.txt", None]
    assert traj.steps[1].observation == "Hello, world!\n[exit status: 0]" and traj.steps[1].exit_status == 0
    assert traj.steps[-1].action.tool == "submit"
    assert traj.metadata["parse_outcomes"]["ok"] == 3 and traj.metadata["turns"] == 3
    t = traj.metadata["timing"]
    assert t["execution_s"] > 0 and t["verify_s"] > 0 and t["overhead_s"] < t["loop_s"]
    # the trajectory round-trips through ATIF and chat messages
    assert from_atif(to_atif(traj)) == traj
    assert conversation_view(from_messages(traj.to_messages())) == conversation_view(traj)

    traj = run(_episode(ScriptedPolicy(["echo nope > /app/hello.txt"])))
    assert traj.outcome is Outcome.FAILURE and traj.reward == 0.0


def test_parse_errors_are_observations_and_are_counted():
    replies = iter(["I will create it.", '<tool_call>{"name": "bash", "arguments": {"command": 1}}</tool_call>',
                    bash_call(SOLVE) + bash_call("ls"), '<tool_call>{"name": "submit"}</tool_call>'])  # fmt: skip
    traj = run(_episode(ScriptedPolicy(lambda messages: next(replies))))
    assert [s.parse_error for s in traj.steps] == ["no_tool_call", "bad_argument", None, None]
    assert "[parse error: no_tool_call]" in traj.steps[0].observation
    assert traj.steps[2].observation.startswith("[note: your reply held 2 tool calls")
    counts = traj.metadata["parse_outcomes"]
    assert (counts["no_tool_call"], counts["bad_argument"], counts["multiple_calls"], counts["ok"]) == (1, 1, 1, 1)
    assert traj.outcome is Outcome.SUCCESS
    # the parse-error turns are in the training messages as assistant text + user observation
    roles = [m["role"] for m in traj.to_messages()]
    assert roles[:6] == ["system", "user", "assistant", "user", "assistant", "user"]

    traj = run(_episode(ScriptedPolicy(lambda m: "no idea"), max_consecutive_parse_errors=3))
    assert traj.stop_reason == "parse_errors" and len(traj.steps) == 3 and traj.outcome is Outcome.FAILURE


def test_turn_and_time_limits_are_agent_failures():
    traj = run(_episode(ScriptedPolicy(["true"] * 10), max_turns=3))
    assert traj.stop_reason == "max_turns" and len(traj.steps) == 3
    assert traj.outcome is Outcome.FAILURE and traj.reward == 0.0

    traj = run(_episode(ScriptedPolicy(["sleep 20", SOLVE]), time_budget_s=2))
    assert traj.stop_reason == "time_budget" and traj.steps[0].timed_out
    assert traj.steps[0].execution_s < 6  # the command's timeout was cut to the budget left
    assert traj.outcome is Outcome.FAILURE and not traj.outcome.is_infra_fault


class _Raising:
    name = "raising"

    def __init__(self, exc, after=0):
        self.exc, self.after, self.calls = exc, after, 0

    def generate(self, batch, tools):
        self.calls += 1
        if self.calls > self.after:
            raise self.exc
        return [Generation(text=bash_call("true")) for _ in batch]


@pytest.mark.parametrize(
    "exc,outcome,text",
    [
        (EndpointError("503 after 5 retries"), Outcome.ENDPOINT_ERROR, "503 after 5 retries"),
        (ValueError("policy bug"), Outcome.HARNESS_ERROR, "ValueError: policy bug"),
    ],
)
def test_policy_faults_are_infrastructure_outcomes(exc, outcome, text):
    traj = run(_episode(_Raising(exc, after=1)))
    assert traj.outcome is outcome and traj.outcome.is_infra_fault
    assert traj.stop_reason == "infra_fault" and text in traj.error
    assert traj.reward is None and len(traj.steps) == 1  # no verifier on a fault


def test_a_dead_sandbox_is_a_sandbox_error():
    async def body():
        env = LocalEnvironment.for_task(TASK)
        await env.start(force_build=False)
        stopper = []

        def kill_after_first_step(i, traj, step):
            stopper.append(asyncio.get_running_loop().create_task(env.stop(delete=True)))

        traj = await run_episode(ScriptedPolicy(["true", "true", "true"]), env, TASK, on_step=kill_after_first_step)
        await asyncio.gather(*stopper)
        return traj

    traj = run(body())
    assert traj.outcome is Outcome.SANDBOX_ERROR and traj.error.startswith("sandbox:")
    assert traj.reward is None


def _task_with_test(tmp_path: Path, test_sh: str, verifier_timeout: float = 60.0) -> Path:
    task = tmp_path / "task"
    shutil.copytree(TASK, task)
    (task / "tests" / "test.sh").write_text(test_sh)
    toml = (task / "task.toml").read_text().replace("[verifier]\ntimeout_sec = 60.0", f"[verifier]\ntimeout_sec = {verifier_timeout}")
    (task / "task.toml").write_text(toml)
    return task


def test_verifier_faults_are_not_agent_failures(tmp_path):
    task = _task_with_test(tmp_path / "a", "#!/bin/bash\necho 'forgot to write the reward'\n")
    traj = run(_episode(ScriptedPolicy([SOLVE]), task=task))
    assert traj.outcome is Outcome.VERIFIER_ERROR and traj.reward is None and "RewardFileNotFoundError" in traj.error
    assert "forgot to write the reward" in traj.metadata["verifier_output_tail"]

    task = _task_with_test(tmp_path / "b", "#!/bin/bash\nsleep 30\necho 1 > /logs/verifier/reward.txt\n", 2.0)
    traj = run(_episode(ScriptedPolicy([SOLVE]), task=task))
    assert traj.outcome is Outcome.VERIFIER_TIMEOUT and traj.reward is None

    task = _task_with_test(tmp_path / "c", "#!/bin/bash\necho 'not a number' > /logs/verifier/reward.txt\n")
    traj = run(_episode(ScriptedPolicy([SOLVE]), task=task))
    assert traj.outcome is Outcome.VERIFIER_ERROR


def test_recovery_attempt_starts_from_a_history_in_a_fork():
    async def body():
        env = LocalEnvironment.for_task(TASK)
        async with env:
            prefix = await run_episode(
                ScriptedPolicy(["cd /tmp && export TARGET=/app/hello.txt", "echo wrong > $TARGET"], submit=False),
                env, TASK, max_turns=2, verify=False,
            )  # fmt: skip
            forks = await env.fork(2)
            try:
                seen = []

                def recover(messages):
                    seen.append(len(messages))
                    k = sum(m["role"] == "assistant" for m in messages)
                    cmds = ["cat $TARGET; pwd", 'echo "Hello, world!" > $TARGET']
                    return bash_call(cmds[k - 2]) if k - 2 < len(cmds) else '<tool_call>{"name": "submit"}</tool_call>'

                trajs = await run_episodes(ScriptedPolicy(recover), [EpisodeSpec(f, TASK, history=prefix) for f in forks])
            finally:
                for f in forks:
                    await f.stop(delete=True)
            return prefix, trajs, seen

    prefix, trajs, seen = run(body())
    assert prefix.outcome is Outcome.PENDING and len(prefix.steps) == 2
    for traj in trajs:
        assert traj.prefix_len == 2 and [s.from_history for s in traj.steps] == [True, True, False, False, False]
        assert traj.steps[:2] == [s.model_copy(update={"from_history": True}) for s in prefix.steps]
        # the fork got the shell's cwd and exported variable back
        assert traj.steps[2].observation == "wrong\n/tmp\n[exit status: 0]"
        assert traj.outcome is Outcome.SUCCESS and traj.reward == 1.0
        assert traj.metadata["turns"] == 3
    assert seen[0] == 2 + 2 * 2  # system, instruction, and the history's two turns


class _Counting(ScriptedPolicy):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.batches: list[int] = []

    def generate(self, batch, tools):
        self.batches.append(len(batch))
        return super().generate(batch, tools)


def test_lockstep_batch_one_generate_call_per_turn():
    async def body():
        env = LocalEnvironment.for_task(TASK)
        async with env:
            prefix = await run_episode(ScriptedPolicy(["true", "true"], submit=False), env, TASK, max_turns=2, verify=False)
            forks = await env.fork(3)
            try:
                policy = _Counting([SOLVE, "sleep 0.5", "true"])
                specs = [EpisodeSpec(f, TASK, history=prefix.steps[:k]) for k, f in enumerate(forks)]
                trajs = await run_episodes(policy, specs)
            finally:
                for f in forks:
                    await f.stop(delete=True)
            return policy, trajs

    policy, trajs = run(body())
    # histories of 0, 1, 2 steps: the same 3-command script submits after 4, 3, 2 generated turns
    assert policy.batches == [3, 3, 2, 1]
    assert [t.metadata["turns"] for t in trajs] == [4, 3, 2]
    assert [t.outcome for t in trajs] == [Outcome.SUCCESS, Outcome.FAILURE, Outcome.FAILURE]
    assert trajs[0].metadata["timing"]["lockstep_wait_s"] >= 0


def test_run_verifier_standalone():
    async def body():
        env = LocalEnvironment.for_task(TASK)
        async with env:
            before = await run_verifier(env, TASK)
            await env.exec(SOLVE)
            after = await run_verifier(env, TASK)
            return before, after

    before, after = run(body())
    assert (before.reward, after.reward) == (0.0, 1.0) and after.error is None and after.duration_s > 0


def test_bash_tool_set_ends_an_attempt_with_a_reply_without_a_tool_call():
    from reterm.agent.protocol import SYSTEM_PROMPT, system_prompt, tool_set

    bash_only = tool_set("bash")
    replies = iter([bash_call(SOLVE), '<tool_call>{"name": "submit"}</tool_call>', "Done: the file is written."])
    traj = run(_episode(ScriptedPolicy(lambda messages: next(replies)), tools=bash_only))
    # the release's protocol: submit is not a tool here, and plain text ends the attempt (then the verifier)
    assert [s.parse_error for s in traj.steps] == [None, "unknown_tool", None]
    assert traj.stop_reason == "submitted" and traj.outcome is Outcome.SUCCESS
    assert not traj.steps[-1].observation and traj.steps[-1].action is None
    assert "submit" not in traj.system_prompt and "reply without calling a tool" in traj.system_prompt
    assert traj.system_prompt == system_prompt(bash_only) != SYSTEM_PROMPT
    # the kit's default keeps submit: plain text is a parse error there
    replies = iter(["Done.", bash_call(SOLVE), '<tool_call>{"name": "submit"}</tool_call>'])
    traj = run(_episode(ScriptedPolicy(lambda messages: next(replies))))
    assert traj.steps[0].parse_error == "no_tool_call" and traj.system_prompt == SYSTEM_PROMPT



class _SlowBatch(ScriptedPolicy):
    """Takes ``per_conversation_s`` a conversation of each call, as a batched local model does."""

    def __init__(self, *args, per_conversation_s: float, **kwargs):
        super().__init__(*args, **kwargs)
        self.per_conversation_s = per_conversation_s

    def generate(self, batch, tools):
        time.sleep(self.per_conversation_s * len(batch))
        return super().generate(batch, tools)


def test_time_budget_charges_a_share_of_each_batched_call_and_no_other_episodes_commands():
    """Four episodes in lock-step, a call taking 0.4 s a conversation (1.6 s for four); one episode's commands
    sleep 3 s each. Charged by the wall clock, every episode would spend its 5 s budget before its second turn;
    charged its own share of each call (~0.4 s) and its own commands, the three fast ones submit a passing attempt
    (about 1.5 s charged, room for a loaded machine) and only the slow one runs out."""
    scripts = {f"task {i}": ["true", SOLVE] for i in range(3)} | {"task slow": ["sleep 3", "sleep 3", "sleep 3", SOLVE]}

    def reply(messages):
        cmds = scripts[messages[1]["content"]]
        k = sum(m["role"] == "assistant" for m in messages)
        return bash_call(cmds[k]) if k < len(cmds) else '<tool_call>{"name": "submit"}</tool_call>'

    async def body():
        env = LocalEnvironment.for_task(TASK)
        async with env:
            forks = await env.fork(4)
            try:
                specs = [EpisodeSpec(f, TASK, instruction=name) for f, name in zip(forks, scripts)]
                return await run_episodes(_SlowBatch(reply, per_conversation_s=0.4), specs, time_budget_s=5)
            finally:
                for f in forks:
                    await f.stop(delete=True)

    trajs = run(body())
    fast, slow = trajs[:3], trajs[3]
    for t in fast:
        assert t.stop_reason == "submitted" and t.outcome is Outcome.SUCCESS, (t.stop_reason, t.metadata["timing"])
        timing = t.metadata["timing"]
        assert timing["budget_charged_s"] < 5 < timing["generation_s"] + timing["lockstep_wait_s"]
    assert slow.stop_reason == "time_budget" and slow.outcome is Outcome.FAILURE
