"""``reterm run TASK --policy SPEC --env KIND``: one episode on one task, printed step by step.

Starts the task's environment (``local`` = this kit's sandbox ``reterm.sandbox.local:LocalEnvironment``;
any Harbor environment type such as ``docker``, ``podman``, ``daytona``; or ``module:Class``), runs
:func:`reterm.agent.episode.run_episode` with the policy built by :func:`reterm.policies.load_policy`,
shows every step (command, output, exit status) as it happens with a live status line, runs the
verifier and prints the reward. Generation uses the kit's shared defaults (:mod:`reterm.generation`:
greedy, :data:`~reterm.generation.MAX_TURN_TOKENS` tokens a turn, a stop after
:data:`~reterm.generation.MAX_CONSECUTIVE_PARSE_ERRORS` parse errors in a row), the drills evaluation's;
``--policy-arg`` and ``--max-parse-errors`` override them. The output folder has Harbor's trial layout: ``agent/trajectory.json``
(ATIF), ``agent/reterm_trajectory.json``, ``verifier/``.

Exit status: 0 when the episode and the verifier ran (whatever the reward), 3 for an infrastructure
fault (sandbox, endpoint, verifier, harness), 2 for bad arguments.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path
from typing import Any

from reterm import policies  # a module, so that tests can replace load_policy
from reterm.agent.atif import write_trial_files
from reterm.agent.environments import environment_kind, make_environment
from reterm.agent.episode import run_episode
from reterm.generation import MAX_CONSECUTIVE_PARSE_ERRORS, MAX_TURN_TOKENS, policy_defaults


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="reterm run",
        description="Run one episode of the agent on a task and print it step by step.",
    )
    p.add_argument("task", help="task folder (or the name of a folder under tasks/)")
    p.add_argument("--policy", default="smollm2",
                   help="policy spec: smollm2 | hf:<path-or-hub-id> (a path starts with /, . or ~; anything else is a "
                   "Hub id) | a plain path | openai:<model> | oracle (default smollm2)")
    p.add_argument("--policy-arg", action="append", default=[], metavar="KEY=VALUE",
                   help="keyword for the policy (repeatable), e.g. base_url=http://127.0.0.1:8000/v1, "
                        f"temperature=0.7 (defaults: temperature=0, max_new_tokens={MAX_TURN_TOKENS})")  # fmt: skip
    p.add_argument("--env", default="local",
                   help="environment: local (this kit's sandbox), a Harbor type (docker, podman, daytona, ...) "
                        "or module:Class (default local)")  # fmt: skip
    p.add_argument("--max-turns", type=int, default=30, help="turns the policy gets (default 30)")
    p.add_argument("--time-budget", type=float, default=None,
                   help="the agent's time in seconds (default the task's [agent] timeout_sec)")
    p.add_argument("--max-parse-errors", type=int, default=MAX_CONSECUTIVE_PARSE_ERRORS,
                   help="stop after N replies in a row without a valid tool call (0: never; default "
                        f"{MAX_CONSECUTIVE_PARSE_ERRORS})")  # fmt: skip
    p.add_argument("--command-timeout", type=float, default=None, help="default seconds per command (30)")
    p.add_argument("--output", type=Path, default=None,
                   help="folder for the trajectory and verifier files (default runs/run-TASK-TIME)")
    p.add_argument("--no-verify", action="store_true", help="skip the verifier")
    p.add_argument("--max-output-lines", type=int, default=25, help="lines of each observation to print")
    return p


def _value(text: str) -> Any:
    for conv in (int, float):
        try:
            return conv(text)
        except ValueError:
            pass
    return {"true": True, "false": False, "none": None}.get(text.lower(), text)


def resolve_task_dir(task: str) -> Path:
    """A task folder from a path or a name under ``tasks/``. Raises ``FileNotFoundError``."""
    path = Path(task)
    if (path / "task.toml").is_file():
        return path
    for root in (Path.cwd() / "tasks", Path(__file__).resolve().parents[2] / "tasks"):
        if (root / task / "task.toml").is_file():
            return root / task
    raise FileNotFoundError(f"{task}: not a task folder (no task.toml) and no tasks/{task}")


class _Printer:
    """Prints steps as they finish and keeps a live status line (rich)."""

    def __init__(self, console: Any, max_turns: int, max_lines: int) -> None:
        self.console, self.max_turns, self.max_lines = console, max_turns, max_lines
        self.t0 = time.monotonic()
        self.status = console.status("starting the terminal ...")

    def phase(self, text: str) -> None:
        self.status.update(f"[bold]{text}[/] [dim]({time.monotonic() - self.t0:.0f} s)[/]")

    def step(self, _: int, traj: Any, step: Any) -> None:
        from rich.markup import escape

        c = self.console
        turn = step.index - traj.prefix_len + 1
        if step.action is None:
            c.print(f"[bold yellow]step {turn}[/] [yellow]parse error: {step.parse_error}[/]"
                    f" [dim]({step.generation_s:.1f} s)[/]")  # fmt: skip
            c.print(f"[dim]{escape(step.model_text.strip()[:300])}[/]")
        elif step.action.tool == "submit":
            c.print(f"[bold green]step {turn}[/] submit [dim]({step.generation_s:.1f} s)[/]")
        else:
            c.print(f"[bold cyan]step {turn}[/] [bold]$ {escape(step.action.command or '')}[/]"
                    f" [dim](model {step.generation_s:.1f} s, run {step.execution_s:.1f} s)[/]")  # fmt: skip
            lines = step.observation.split("\n")
            body, status = lines[:-1], lines[-1]
            if len(body) > self.max_lines:
                body = body[: self.max_lines // 2] + [f"... {len(body) - self.max_lines} more lines ..."] + body[-self.max_lines // 2 :]
            if body:
                c.print(escape("\n".join(body)), highlight=False)
            style = "green" if step.exit_status == 0 else "red" if step.exit_status is not None else "yellow"
            c.print(f"[{style}]{escape(status)}[/]")
        self.phase(f"turn {turn + 1}/{self.max_turns}: generating")


async def _run(args: argparse.Namespace) -> int:
    from harbor.models.task.task import Task
    from rich.console import Console

    console = Console()
    task_dir = resolve_task_dir(args.task)
    task = Task(task_dir)
    task_id = str(task.name).split("/")[-1]
    # bad input fails before an output folder exists: the environment kind, the policy spec, the policy itself
    environment_kind(args.env)
    spec = policies.check_policy_spec(args.policy)
    out = args.output or Path("runs") / f"run-{task_id}-{time.strftime('%Y%m%d-%H%M%S')}"
    if out.exists() and not out.is_dir():
        raise ValueError(f"--output {out}: exists and is not a folder")
    kwargs = dict(kv.split("=", 1) for kv in args.policy_arg)
    kwargs = policy_defaults(spec, **{k: _value(v) for k, v in kwargs.items()})
    if spec == "oracle":
        kwargs.setdefault("tasks", task_dir)
    console.print(f"[bold]task[/] {task_id}  [bold]policy[/] {spec}  [bold]env[/] {args.env}  [bold]output[/] {out}")
    with console.status(f"loading policy {spec} ..."):
        try:
            policy = policies.load_policy(spec, **kwargs)
        except OSError as exc:  # transformers: no such folder / not a model / not on the Hub
            raise ValueError(f"--policy {spec}: the model could not be loaded: {exc}") from exc
    out.mkdir(parents=True, exist_ok=True)
    env = make_environment(args.env, task, out)
    printer = _Printer(console, args.max_turns, args.max_output_lines)
    traj = None
    with printer.status:
        printer.phase(f"starting the {args.env} environment")
        t0 = time.monotonic()
        try:
            await env.start(force_build=False)
        except Exception as exc:
            console.print(f"[bold red]sandbox error:[/] the environment did not start: {type(exc).__name__}: {exc}")
            return 3
        try:
            if hasattr(env, "ensure_dirs"):
                from harbor.models.trial.paths import EnvironmentPaths

                p = EnvironmentPaths.for_os(env.os)
                await env.ensure_dirs([p.agent_dir, p.verifier_dir, p.artifacts_dir])
            console.print(f"[dim]environment ready in {time.monotonic() - t0:.1f} s[/]")
            printer.phase(f"turn 1/{args.max_turns}: generating")
            traj = await run_episode(
                policy, env, task, max_turns=args.max_turns, time_budget_s=args.time_budget,
                command_timeout_s=args.command_timeout, verify=not args.no_verify, trial_dir=out,
                max_consecutive_parse_errors=args.max_parse_errors or None,
                on_step=printer.step,
            )  # fmt: skip
        finally:
            printer.phase("stopping the environment")
            try:
                await env.stop(delete=True)
            except Exception as exc:  # cleanup trouble is reported, not raised over the result
                console.print(f"[yellow]environment stop failed: {exc}[/]")
    assert traj is not None
    write_trial_files(traj, out / "agent")
    style = "green" if traj.passed else "red" if not traj.outcome.is_infra_fault else "yellow"
    reward = "-" if traj.reward is None else f"{traj.reward:g}"
    t = traj.metadata.get("timing", {})
    console.rule()
    console.print(f"[bold {style}]reward {reward}  outcome {traj.outcome.value}[/]  stop: {traj.stop_reason}  "
                  f"turns: {traj.metadata.get('turns')}  wall: {traj.wall_s:.1f} s "
                  f"(model {t.get('generation_s', 0):.1f} s, commands {t.get('execution_s', 0):.1f} s)")  # fmt: skip
    if traj.error:
        console.print(f"[yellow]{traj.error}[/]")
    errors = {k: v for k, v in traj.metadata.get("parse_outcomes", {}).items() if v and k not in ("ok",)}
    if errors:
        console.print(f"parse outcomes: {errors}")
    console.print(f"trajectory: {out / 'agent' / 'trajectory.json'} (ATIF), {out / 'agent' / 'reterm_trajectory.json'}")
    return 3 if traj.outcome.is_infra_fault else 0


def main(argv: list[str] | None = None) -> int:
    """``reterm run`` entry point (see the module docstring). Returns the exit status."""
    args = _parser().parse_args(argv)
    for flag, value in (("--max-turns", args.max_turns), ("--time-budget", args.time_budget),
                        ("--command-timeout", args.command_timeout)):  # fmt: skip
        if value is not None and not value > 0:
            print(f"reterm run: {flag} must be positive, got {value:g}", file=sys.stderr)
            return 2
    if args.max_parse_errors < 0:
        print(f"reterm run: --max-parse-errors must be >= 0 (0: never stop), got {args.max_parse_errors}",
              file=sys.stderr)  # fmt: skip
        return 2
    for kv in args.policy_arg:
        if "=" not in kv:
            print(f"reterm run: --policy-arg {kv!r} is not KEY=VALUE", file=sys.stderr)
            return 2
    try:
        from reterm.tasks.loader import read_config

        read_config(resolve_task_dir(args.task) / "task.toml")  # bad TOML / fields: named by file and field
        return asyncio.run(_run(args))
    except (FileNotFoundError, ValueError) as exc:
        print(f"reterm run: {exc}", file=sys.stderr)
        return 2
