"""Error injection: failure states made by perturbing one step of a successful trajectory.

A second source of failure states, for the error categories the policy's own failures miss. Sources
are successful trajectories: the task's reference solution run through the harness by the scripted
oracle (:class:`reterm.policies.scripted.OraclePolicy`), and the policy's own successful rollouts.
One step is perturbed, the whole perturbed command list is executed **for real** in a fresh sandbox
through the harness (:class:`reterm.policies.scripted.ScriptedPolicy`, then the verifier), and the run is
localised with :func:`reterm.recovery.localise`. The perturbation is kept only if the verifier fails the run
and the localiser finds a failure at or after the perturbed step (it really failed); the failure state is
the run's attempt-level one (:func:`reterm.recovery.attempts.attempt_end_state`, exactly as for the policy's
own failures), labelled with the category of the step the perturbation broke. Records from it say
``failure_source="injected"`` and describe the perturbation in ``injection``.

Perturbations (``kind``; each returns a new command list):

- ``misspelt_command``: two adjacent letters of the program name swapped (``python3`` -> ``pyhton3``).
- ``wrong_flag``: a long option's letters swapped (``--strip-components`` -> ``--strip-cmoponents``), or
  a plausible wrong flag for a common tool (``mkdir -p`` -> ``mkdir --recursive``, ``chmod +x`` -> ``+e``).
- ``wrong_path``: one character dropped from the last component of an absolute path the command reads.
- ``removed_dependency``: the step that installs something is dropped (``dpkg -i``, ``pip install``,
  ``python3 -m venv``), or ``python3`` is called as ``python`` (not installed in these images).
- ``bug_in_file``: a bug inserted into code written with a heredoc (a file, or a script typed inline as
  ``python3 - <<'PY'``): a comparison or arithmetic operator flipped, ``True``/``False`` swapped, a
  block's colon removed.
- ``foreground_hang``: a service the solution starts in the background (``... &``) started in the
  foreground instead.

Own code: no library perturbs shell trajectories.
"""

from __future__ import annotations

import hashlib
import random
import re
import shlex
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable

from reterm.agent.episode import EpisodeSpec, run_episodes
from reterm.data.environments import make_environment, stop_quietly
from reterm.policies.scripted import ScriptedPolicy
from reterm.recovery import localise
from reterm.recovery.attempts import Attempt, attempt_end_state
from reterm.trajectory import Outcome, Trajectory

_WORD = re.compile(r"^[A-Za-z][A-Za-z0-9_.+-]{2,}$")
_SHELL_WORDS = {"if", "then", "else", "elif", "fi", "for", "while", "until", "do", "done", "case", "esac",
                "function", "export", "set", "unset", "source", "eval", "exec", "true", "false", "test"}  # fmt: skip
_INSTALL = re.compile(r"\b(dpkg\s+-i|apt(?:-get)?\s+install|pip3?\s+install|python3?\s+-m\s+pip\s+install|"
                      r"python3?\s+-m\s+venv|make\s+install)\b")  # fmt: skip
_HEREDOC = re.compile(r"^\s*cat\s*>\s*(\S+)\s*<<-?\s*['\"]?(\w+)['\"]?\s*$")
_ANY_HEREDOC = re.compile(r"<<-?\s*['\"]?(\w+)['\"]?\s*(\|.*)?$")  # e.g. python3 - <<'PY'  (a script typed inline)
_PATH = re.compile(r"(?<![>\w$])(/(?:[A-Za-z0-9_.-]+/)*[A-Za-z0-9_.-]{3,})")
# (program, flag, wrong flag): flags people get wrong, that the tool rejects
_WRONG_FLAGS = [
    ("mkdir", "-p", "--recursive"), ("sort", "-n", "--numerical"), ("sed", "-n", "--silence"),
    ("ls", "-l", "--long"), ("head", "-n", "--lines-count"), ("tail", "-n", "--lines-count"),
    ("chmod", "+x", "+e"), ("python3", "-m", "--module"), ("find", "-name", "--name"), ("date", "-d", "--data"),
    ("cp", "-r", "--recurse-into"), ("tar", "-C", "--dir"), ("git", "-m", "--msg"),
]  # fmt: skip
# (pattern, replacement, what): bugs inserted into written code
_BUGS = [
    (r" <= ", " < ", "`<=` -> `<`"), (r" < ", " <= ", "`<` -> `<=`"), (r" >= ", " > ", "`>=` -> `>`"),
    (r" > ", " >= ", "`>` -> `>=`"), (r" == ", " != ", "`==` -> `!=`"), (r" != ", " == ", "`!=` -> `==`"),
    (r"\+ 1\b", "- 1", "`+ 1` -> `- 1`"), (r"- 1\b", "+ 1", "`- 1` -> `+ 1`"),
    (r"\bTrue\b", "False", "`True` -> `False`"), (r"\bFalse\b", "True", "`False` -> `True`"),
    (r"^(\s*(?:def|if|elif|for|while|with|class)\b.*):\s*$", r"\1", "colon removed"),
]  # fmt: skip


@dataclass(frozen=True)
class Perturbation:
    """A perturbed command list: ``commands`` replaces the source's; ``step`` is the index (in
    ``commands``) of the perturbed command, or of the command after a removed one."""

    kind: str
    step: int
    commands: tuple[str, ...]
    description: str

    def key(self, source_id: str) -> str:
        blob = repr((source_id, self.kind, self.step, self.commands))
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["commands"] = list(self.commands)
        return d


def _first_line(cmd: str) -> str:
    return cmd.split("\n", 1)[0]


def _tokens(line: str) -> list[str]:
    try:
        return shlex.split(line, posix=True)
    except ValueError:
        return line.split()


def _swap(word: str, rng: random.Random, start: int = 1) -> str | None:
    """``word`` with two adjacent characters swapped (never the first ``start`` ones), or None."""
    spots = [i for i in range(start, len(word) - 1) if word[i] != word[i + 1] and word[i].isalpha() and word[i + 1].isalpha()]
    if not spots:
        return None
    i = rng.choice(spots)
    return word[:i] + word[i + 1] + word[i] + word[i + 2 :]


def _replace_once(cmd: str, old: str, new: str) -> str:
    """Replace the first whole-token occurrence of ``old`` in the first line of ``cmd``."""
    line, _, rest = cmd.partition("\n")
    line = re.sub(rf"(?<!\S){re.escape(old)}(?!\S)", new.replace("\\", "\\\\"), line, count=1)
    return line + ("\n" + rest if rest else "")


def _with(cmds: list[str], i: int, new: str) -> tuple[str, ...]:
    return tuple(cmds[:i] + [new] + cmds[i + 1 :])


# --------------------------------------------------------------------------------- operators
def misspelt_command(cmds: list[str], rng: random.Random) -> list[Perturbation]:
    out = []
    for i, cmd in enumerate(cmds):
        toks = _tokens(_first_line(cmd))
        if not toks or "=" in toks[0] or toks[0] in _SHELL_WORDS or not _WORD.match(toks[0]):
            continue
        wrong = _swap(toks[0], rng)
        if wrong:
            out.append(Perturbation("misspelt_command", i, _with(cmds, i, _replace_once(cmd, toks[0], wrong)),
                                    f"misspelt command in step {i}: `{toks[0]}` -> `{wrong}`"))  # fmt: skip
    return out


def wrong_flag(cmds: list[str], rng: random.Random) -> list[Perturbation]:
    out = []
    for i, cmd in enumerate(cmds):
        toks = _tokens(_first_line(cmd))
        if not toks:
            continue
        longs = [t for t in toks[1:] if t.startswith("--") and len(t.split("=")[0]) > 5]
        if longs:
            flag = longs[0].split("=")[0]
            wrong = _swap(flag, rng, start=3)
            if wrong:
                new = _replace_once(cmd, longs[0], longs[0].replace(flag, wrong, 1))
                out.append(Perturbation("wrong_flag", i, _with(cmds, i, new),
                                        f"wrong flag in step {i}: `{flag}` -> `{wrong}`"))  # fmt: skip
                continue
        for program, flag, wrong in _WRONG_FLAGS:
            if toks[0] == program and flag in toks[1:]:
                out.append(Perturbation("wrong_flag", i, _with(cmds, i, _replace_once(cmd, flag, wrong)),
                                        f"wrong flag in step {i}: `{program} {flag}` -> `{program} {wrong}`"))  # fmt: skip
                break
    return out


def wrong_path(cmds: list[str], rng: random.Random) -> list[Perturbation]:
    out = []
    for i, cmd in enumerate(cmds):
        line = _first_line(cmd)
        if _HEREDOC.match(line):
            continue
        paths = [m.group(1) for m in _PATH.finditer(line)  # paths read, not redirection targets
                 if not m.group(1).startswith(("/dev/", "/proc/", "/tmp/")) and not line[: m.start()].rstrip().endswith(">")]
        for path in paths:
            head, _, last = path.rpartition("/")
            spots = [k for k in range(1, len(last)) if last[k].isalpha() and last[k] != last[k - 1]]
            if not spots:
                continue
            k = rng.choice(spots)
            wrong = f"{head}/{last[:k]}{last[k + 1:]}"
            new = cmd.replace(path, wrong, 1)
            out.append(Perturbation("wrong_path", i, _with(cmds, i, new), f"wrong path in step {i}: `{path}` -> `{wrong}`"))
            break
    return out


def removed_dependency(cmds: list[str], rng: random.Random) -> list[Perturbation]:
    out = []
    for i, cmd in enumerate(cmds):
        m = _INSTALL.search(_first_line(cmd))
        if m and i + 1 < len(cmds):
            out.append(Perturbation("removed_dependency", i, tuple(cmds[:i] + cmds[i + 1 :]),
                                    f"removed dependency: the install step {i} `{_first_line(cmd)[:80]}` was left out"))  # fmt: skip
        toks = _tokens(_first_line(cmd))
        if toks and toks[0] == "python3":
            out.append(Perturbation("removed_dependency", i, _with(cmds, i, _replace_once(cmd, "python3", "python")),
                                    f"removed dependency in step {i}: `python3` called as `python`, which is not installed"))  # fmt: skip
    return out


def bug_in_file(cmds: list[str], rng: random.Random) -> list[Perturbation]:
    out = []
    for i, cmd in enumerate(cmds):
        lines = cmd.split("\n")
        m = _HEREDOC.match(lines[0])
        if (not m and not _ANY_HEREDOC.search(lines[0])) or len(lines) < 3:
            continue
        target = m.group(1) if m else "the script typed inline"
        candidates = []
        for j in range(1, len(lines) - 1):
            if lines[j].lstrip().startswith("#"):
                continue
            for pattern, repl, what in _BUGS:
                if re.search(pattern, lines[j]):
                    candidates.append((j, pattern, repl, what))
        if not candidates:
            continue
        j, pattern, repl, what = rng.choice(candidates)
        new_lines = list(lines)
        new_lines[j] = re.sub(pattern, repl, lines[j], count=1)
        out.append(Perturbation("bug_in_file", i, _with(cmds, i, "\n".join(new_lines)),
                                f"bug inserted into {target} (step {i}), line {j}: {what}"))  # fmt: skip
    return out


def foreground_hang(cmds: list[str], rng: random.Random) -> list[Perturbation]:
    out = []
    for i, cmd in enumerate(cmds):
        line = _first_line(cmd).rstrip()
        if "\n" in cmd or not line.endswith("&") or line.endswith("&&"):
            continue
        fg = re.sub(r"^(setsid\s+)?(nohup\s+)?", "", line[:-1].rstrip())
        fg = re.sub(r"\s*(>\S*|2>&1|</dev/null|>/dev/null)(\s+|$)", " ", fg).strip()
        if fg:
            out.append(Perturbation("foreground_hang", i, _with(cmds, i, fg),
                                    f"service started in the foreground in step {i}: `{fg[:80]}`"))  # fmt: skip
    return out


OPERATORS: dict[str, Callable[[list[str], random.Random], list[Perturbation]]] = {
    "misspelt_command": misspelt_command,
    "wrong_flag": wrong_flag,
    "wrong_path": wrong_path,
    "removed_dependency": removed_dependency,
    "bug_in_file": bug_in_file,
    "foreground_hang": foreground_hang,
}


def commands_of(traj: Trajectory) -> list[str]:
    """The bash commands of a trajectory, in order."""
    return [s.command for s in traj.steps if s.command]


def choose(traj: Trajectory, kinds: list[str], n: int, seed: int) -> list[Perturbation]:
    """Up to ``n`` perturbations of ``traj``, spread over ``kinds`` (round robin, seeded by ``seed`` and the
    trajectory's task), each a distinct command list."""
    base = hashlib.sha256(f"{seed}:{traj.task_id}:{traj.metadata.get('rollout_id', '')}".encode()).hexdigest()
    cmds = commands_of(traj)
    pools = []
    for kind in kinds:
        rng = random.Random(int(base[:12], 16) ^ int(hashlib.sha256(kind.encode()).hexdigest()[:8], 16))
        cands = OPERATORS[kind](cmds, rng)
        rng.shuffle(cands)
        pools.append(cands)
    out: list[Perturbation] = []
    seen: set[tuple[str, ...]] = set()
    while len(out) < n and any(pools):
        for pool in pools:
            while pool and len(out) < n:
                p = pool.pop(0)
                if p.commands not in seen and p.commands != tuple(cmds):
                    seen.add(p.commands)
                    out.append(p)
                    break
    return out


# ------------------------------------------------------------------------------------ running
async def run_commands(task_dir: Any, commands: list[str], environment: Any, timeout: float, name: str,
                       instruction: str | None = None) -> Trajectory:  # fmt: skip
    """Type ``commands`` (then submit) into a fresh environment through the harness and verify.

    ``environment`` is a :class:`reterm.data.config.EnvironmentConfig`; every command gets ``timeout``
    seconds (written into its tool call, so a replay applies it). Returns the scored trajectory (or one
    with an infrastructure-fault outcome); the environment is always stopped.
    """

    env = make_environment(environment, task_dir, "inject")
    try:
        await env.start(force_build=False)
        spec = EpisodeSpec(env, task_dir, instruction=instruction)
        policy = ScriptedPolicy(commands, timeout=timeout, name=name)
        (traj,) = await run_episodes(policy, [spec], max_turns=len(commands) + 1, command_timeout_s=timeout,
                                     verify=True)  # fmt: skip
    finally:
        await stop_quietly(env)
    return traj


def injected_state(traj: Trajectory, perturbation: Perturbation, task_dir: str | Path) -> tuple[Any, str]:
    """(attempt-level failure state, "") when the perturbed run failed the verifier and the localiser finds it
    failing at or after the perturbed step, else (None, why not).

    The state is :func:`reterm.recovery.attempts.attempt_end_state` of the perturbed run (the whole attempt,
    then the feedback message: the release's protocol, as for the policy's own failures); its category,
    command, output and evidence are those of the failing step the perturbation caused. The steps before the
    perturbed one are the successful source's, so they are localised as history (``prefix_len`` = the
    perturbed step): a failure the source itself had and resolved (a solution that first runs the failing
    tests, say) is context, and a failure that only comes back because of the perturbation counts at the step
    where it comes back.
    """

    if traj.outcome.is_infra_fault:
        return None, f"infrastructure fault: {traj.error}"
    view = traj.model_copy(update={"prefix_len": min(perturbation.step, len(traj.steps))})
    primary = localise(view).primary
    if primary is None:
        return None, "did not fail (no failure state found)"
    if traj.outcome is not Outcome.FAILURE or traj.metadata.get("broken_by_agent"):
        why = "broke its sandbox" if traj.metadata.get("broken_by_agent") else f"outcome {traj.outcome.value}"
        return None, f"the perturbed attempt is not a recoverable failed attempt ({why})"
    state = attempt_end_state(Attempt(Path(task_dir), traj))
    state.category, state.command, state.output = primary.category, primary.command, primary.output
    state.exit_status, state.evidence = primary.exit_status, primary.evidence
    state.localisation.confidence = primary.localisation.confidence
    return state, ""
