"""Replay fork (reterm.sandbox.replay): the fork for any Harbor environment, run here on the local sandbox."""

from __future__ import annotations

from sandbox_support import HELLO_TASK, run

from reterm.sandbox.local import LocalEnvironment
from reterm.sandbox.replay import RecordedCommand, build_script, commands_from_trajectory, parse_output, replay_fork
from reterm.trajectory import Action, Step, Trajectory

PREFIX = [
    RecordedCommand("cd /tmp && mkdir -p work", 0),
    RecordedCommand("export GREETING=hi; cd work", 0),  # shell state must carry over
    RecordedCommand("echo $GREETING > f.txt; pwd", 0, "/tmp/work\n"),
    RecordedCommand("if then", 2),  # a syntax error fails this command only
    RecordedCommand("cat f.txt", 0, "hi"),
    RecordedCommand("test -e /nonexistent", 0),  # recorded as success: this copy diverges
    RecordedCommand("date +%N", None, "123"),  # output differs (time), exit code unknown
]


def test_replay_fork_reproduces_shell_state_and_flags_divergence():
    async def body():
        results = await replay_fork(lambda i: LocalEnvironment.for_task(HELLO_TASK), PREFIX, 2, compare_output=True)
        try:
            states = [(await r.environment.exec("cat /tmp/work/f.txt")).stdout for r in results]
            await results[0].environment.exec("echo mine > /tmp/work/f.txt")
            other = (await results[1].environment.exec("cat /tmp/work/f.txt")).stdout
            return results, states, other
        finally:
            for r in results:
                await r.environment.stop()

    results, states, other = run(body())
    assert states == ["hi\n", "hi\n"] and other == "hi\n"  # same state, independent copies
    for r in results:
        assert r.exit_codes == [0, 0, 0, 2, 0, 1, 0]
        assert r.outputs[2] == "/tmp/work\n" and "syntax error" in r.outputs[3]
        kinds = [(d.index, d.kind) for d in r.divergences]
        assert kinds == [(5, "exit_code"), (6, "output")]
        assert r.diverged


def test_exit_ends_the_replay_and_later_commands_are_missing():
    async def body():
        [r] = await replay_fork(lambda i: LocalEnvironment.for_task(HELLO_TASK), ["true", "exit 4", "echo never"], 1)
        await r.environment.stop()
        return r

    r = run(body())
    assert r.exit_codes == [0, None, None]
    assert [(d.index, d.kind) for d in r.divergences] == [(1, "missing"), (2, "missing")]


def test_long_prefix_goes_through_a_file():
    big = [f"echo {i} {'x' * 5000} > /dev/null" for i in range(40)] + ["echo last"]

    async def body():
        [r] = await replay_fork(lambda i: LocalEnvironment.for_task(HELLO_TASK), big, 1)
        leftover = await r.environment.exec("ls /tmp/.reterm-replay-* 2>/dev/null | wc -l")
        await r.environment.stop()
        return r, leftover

    r, leftover = run(body())
    assert len(build_script(big, "n")) > 100_000
    assert r.exit_codes == [0] * 41 and r.outputs[-1] == "last\n" and not r.diverged
    assert leftover.stdout.strip() == "0"


def test_parse_output_and_commands_from_trajectory():
    codes, outs = parse_output("junk\n__RETERM_BEGIN_n 0\nout\n__RETERM_END_n 0 3\n", 2, "n")
    assert codes == [3, None] and outs == ["out", None]
    traj = Trajectory(task_id="t", instruction="i", system_prompt="s", steps=[
        Step(index=0, model_text="", action=Action(tool="bash", command="ls"), exit_status=0),
        Step(index=1, model_text="", parse_error="no_action"),
        Step(index=2, model_text="", action=Action(tool="bash", command="false"), exit_status=1),
        Step(index=3, model_text="", action=Action(tool="submit")),
    ])  # fmt: skip
    assert commands_from_trajectory(traj) == [RecordedCommand("ls", 0), RecordedCommand("false", 1)]
    assert commands_from_trajectory(traj, upto=1) == [RecordedCommand("ls", 0)]
