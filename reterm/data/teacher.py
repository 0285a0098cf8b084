"""Recovery policies: the offline oracle-guided teacher, and loading the others from a config.

The paper's pipeline wrote recoveries with a stronger model; offline, this kit's teacher is
*oracle-guided*: at a failure state it first states a diagnosis from the observed error and its
category (:mod:`reterm.recovery.taxonomy`), then continues with the task's reference solution
(``solution/solve.sh`` split into terminal commands by :func:`reterm.tasks.solution_steps`), starting at
the first solution step the failure prefix has not already run successfully, skipping the failing
command when the solution has it verbatim (so after an injected typo it redoes that step correctly;
after the policy's own unrelated attempt it follows the solution from its start), then submits. The verifier still decides: an attempt whose prefix broke the environment
beyond what the solution repairs fails and is recorded as a failed attempt.

Like :class:`reterm.policies.scripted.OraclePolicy`, every reply is a function of its own conversation
only (the episode loop batches several attempts in one ``generate`` call): :meth:`OracleGuidedTeacher.register`
stores the plan of a failure state under a hash of its prefix messages, and a conversation is answered
by the plan whose prefix it starts with, at the position given by the assistant turns after it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from reterm.agent.protocol import SYSTEM_PROMPT
from reterm.policies import load_policy
from reterm.policies.base import Generation
from reterm.policies.scripted import CallFormat, bash_call, submit_call
from reterm.recovery.state import State, state_id
from reterm.trajectory import Trajectory

ORACLE_GUIDED = "oracle-guided"

# What the teacher says about each category: the cause in one sentence and what to do instead.
# Worded from the definitions in docs/ERROR_TAXONOMY.md.
DIAGNOSES: dict[str, str] = {
    "missing_dependency": "a program, package or module this step needs is not installed here, so repeating "
                          "the command cannot work; I will use what the environment provides instead.",
    "wrong_command": "the command itself is wrong (a typo, a wrong flag or bad syntax); I will correct the "
                     "command rather than run it again unchanged.",
    "path_permission": "the command used a path that does not exist here or cannot be accessed; I will use "
                       "the real paths and permissions of this environment.",
    "faulty_implementation": "what was written or changed is wrong, as this error shows; I will write it "
                             "again correctly and check the result.",
    "wrong_state": "the environment is not in the state the command assumed; I will bring it into the right "
                   "state before continuing.",
    "timeout_hang": "the command did not return in time (it waited for input or ran in the foreground); I "
                    "will run things so that they cannot block the terminal.",
    "premature_completion": "the task is not finished yet, so submitting now would fail; I will complete the "
                            "remaining work and check it first.",
    "other": "the step failed for a reason that needs a different approach; I will take another route.",
}


def _first_line(command: str, limit: int = 80) -> str:
    line = command.strip().splitlines()[0] if command.strip() else command
    return line if len(line) <= limit else line[: limit - 3] + "..."


def diagnosis(state: State, next_command: str | None) -> str:
    """The teacher's first-turn text: what failed, why (the category), and what comes next."""
    evidence = (state.evidence or "").strip()
    if not evidence or evidence not in (state.output or ""):  # else the last line the command printed
        lines = [ln for ln in (state.output or "").splitlines() if ln.strip() and not ln.startswith("[")]
        evidence = lines[-1] if lines else ""
    evidence = _first_line(evidence, 160)
    cause = DIAGNOSES.get(state.category, DIAGNOSES["other"])
    if state.category == "premature_completion":
        head = "Before submitting I checked the state of the task."
    elif state.exit_status not in (None, 0):
        head = f"The last command failed with exit status {state.exit_status}: `{evidence}`."
    else:
        head = f"The last command did not do what was needed: `{evidence}`."
    nxt = f" Next: `{_first_line(next_command)}`." if next_command else " Everything needed is in place now."
    return f"{head} Diagnosis ({state.category.replace('_', ' ')}): {cause}{nxt}"


def prefix_messages(instruction: str, state: State) -> list[dict[str, Any]]:
    """The conversation of a failure state as the harness shows it: system, instruction, history."""
    return Trajectory(task_id=state.task_id, instruction=instruction, system_prompt=SYSTEM_PROMPT,
                      steps=state.history).to_messages()  # fmt: skip


def resume_position(solution: list[str], state: State) -> int:
    """Index of the first solution step the prefix has not run successfully (exit 0, not timed out).

    The failing command itself also counts as run when the solution has it verbatim: it is a step
    whose error the solution expects (a probe such as running a script to see why it fails), and its
    output is already in the prefix; repeating it unchanged would not recover anything.
    """
    done = {s.command for s in state.history if s.command and s.exit_status == 0 and not s.timed_out}
    if state.command:
        done.add(state.command)
    for i, step in enumerate(solution):
        if step not in done:
            return i
    return len(solution)


@dataclass(frozen=True)
class Plan:
    """What the teacher does from one failure state: the first turn's text and the commands."""

    diagnosis: str
    commands: tuple[str, ...]


class OracleGuidedTeacher:
    """The offline recovery teacher (see the module docstring).

    Args:
        tasks: task id -> task folder (the solutions are read from there).
        call_format: tool-call syntax of the replies (``hermes`` JSON or ``qwen``).
        name: the policy's name in trajectories and records.

    Raises:
        FileNotFoundError / SolutionSplitError: (at :meth:`register`) a task without a usable solution.
        ValueError: (at :meth:`generate`) a conversation that starts with no registered failure prefix.
    """

    def __init__(self, tasks: dict[str, Path], *, call_format: CallFormat = "hermes", name: str = ORACLE_GUIDED) -> None:
        self.tasks = {k: Path(v) for k, v in tasks.items()}
        self.call_format, self.name = call_format, name
        self._solutions: dict[str, list[str]] = {}
        self._plans: dict[str, Plan] = {}  # state_id -> plan
        self._tasks: dict[str, set[str]] = {}  # instruction -> task ids registered with it
        self._lengths: set[int] = set()

    def solution(self, task_id: str) -> list[str]:
        """The reference solution of a task as terminal commands (cached)."""
        if task_id not in self._solutions:
            from reterm.tasks import solution_steps

            if task_id not in self.tasks:
                raise ValueError(f"OracleGuidedTeacher: unknown task {task_id!r}")
            self._solutions[task_id] = list(solution_steps(self.tasks[task_id]))
        return self._solutions[task_id]

    def plan(self, state: State) -> Plan:
        """The plan for ``state``: diagnosis, then the solution from :func:`resume_position`."""
        solution = self.solution(state.task_id)
        commands = tuple(solution[resume_position(solution, state):])
        return Plan(diagnosis(state, commands[0] if commands else None), commands)

    def register(self, state: State, instruction: str) -> Plan:
        """Make the teacher answer conversations that start with this failure state's prefix."""
        messages = prefix_messages(instruction, state)
        plan = self.plan(state)
        self._plans[state_id(state.task_id, messages)] = plan  # the state's one id (reterm.recovery.state)
        self._tasks.setdefault(instruction.strip(), set()).add(state.task_id)
        self._lengths.add(len(messages))
        return plan

    def reply(self, messages: list[dict[str, Any]]) -> str:
        """The raw reply text for one conversation."""
        user = next((str(m.get("content") or "") for m in messages if m.get("role") == "user"), "")
        tasks = sorted(self._tasks.get(user.strip(), ()))
        for n in sorted(self._lengths, reverse=True):
            if len(messages) < n:
                continue
            plan = next((self._plans[k] for k in (state_id(t, messages[:n]) for t in tasks) if k in self._plans), None)
            if plan is None:
                continue
            k = sum(1 for m in messages[n:] if m.get("role") == "assistant")
            if k < len(plan.commands):
                call = bash_call(plan.commands[k], call_format=self.call_format)
            else:
                call = submit_call(self.call_format)
            return f"{plan.diagnosis}\n\n{call}" if k == 0 else call
        raise ValueError("OracleGuidedTeacher: the conversation starts with no registered failure prefix")

    def generate(self, batch: list[list[dict[str, Any]]], tools: list[dict[str, Any]]) -> list[Generation]:
        """One :class:`Generation` per conversation (``finish_reason="stop"``)."""
        return [Generation(text=self.reply(m), finish_reason="stop") for m in batch]


def load_recovery_policy(spec: str, kwargs: dict[str, Any], tasks: dict[str, Path], rollout_policy: str,
                         rollout_kwargs: dict[str, Any]) -> Any:  # fmt: skip
    """The recovery policy of a config: ``oracle-guided``, ``self`` (the rollout policy) or a
    :func:`reterm.policies.load_policy` spec (e.g. ``openai:MODEL`` for a teacher endpoint).

    Raises ``ValueError`` for ``self`` with a scripted rollout policy (a command list cannot recover).
    """
    if spec == ORACLE_GUIDED:
        return OracleGuidedTeacher(tasks, **kwargs)

    if spec == "self":
        if rollout_policy == "scripted":
            raise ValueError("recovery.policy 'self' needs a model policy; the rollout policy is 'scripted'")
        return load_policy(rollout_policy, **{**rollout_kwargs, **kwargs})
    if spec == "oracle":
        kwargs = {"tasks": [str(p) for p in tasks.values()], **kwargs}
    return load_policy(spec, **kwargs)
