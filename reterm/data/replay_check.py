"""The replay check: a record's whole conversation typed again into a fresh sandbox, then the verifier.

A kept recovery must be re-verifiable from the record alone: the whole conversation read by the one record
reader (:meth:`reterm.recovery.state.State.from_record`, as a state whose history is every message) is
rebuilt by the one rebuild (:func:`reterm.recovery.materialize.materialize`, ``method="replay"``: a fresh
environment of the task, every bash command typed into the kit's terminal in order with the timeout its tool
call gave, else the default of its part, and the divergence check), then the task's verifier runs
(:func:`reterm.agent.episode.run_verifier`). The pipeline drops records whose replay does not reach reward
1.0 again (for instance a recovery that only worked because a fork carried files but not a process) or
diverged (a command's exit status differs from the record's), counted with the quality filter.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from reterm.agent.episode import run_verifier
from reterm.data.config import EnvironmentConfig
from reterm.data.environments import make_environment, stop_quietly
from reterm.recovery.materialize import materialize
from reterm.recovery.state import State


def record_actions(record: dict[str, Any]) -> list[tuple[str, float | None, bool]]:
    """(command, timeout or None, in the recovery part) of every bash call in ``record["messages"]``."""
    out = []
    for k, m in enumerate(record["messages"]):
        if m["role"] != "assistant":
            continue
        for call in m.get("tool_calls") or []:
            if call["function"]["name"] != "bash":
                continue
            args = json.loads(call["function"]["arguments"] or "{}")
            timeout = args.get("timeout")
            out.append((str(args.get("command", "")), float(timeout) if timeout is not None else None,
                        k >= record["train_from_message_index"]))  # fmt: skip
    return out


async def replay_record(record: dict[str, Any], task_dir: str | Path, environment: EnvironmentConfig,
                        prefix_timeout: float, recovery_timeout: float) -> dict[str, Any]:  # fmt: skip
    """Replay a record in a fresh environment (divergence checked) and verify it.

    Returns ``{"reward": float | None, "error": str | None}``: ``reward`` ``None`` with ``error`` for an
    infrastructure fault, or for a replay that diverged (``error`` starts with ``diverged:``); the
    environment is always stopped.
    """
    actions = record_actions(record)
    try:
        whole = State.from_record({**record, "train_from_message_index": len(record["messages"])})
    except ValueError as exc:
        return {"reward": None, "error": f"diverged: {exc}"[:500]}
    if len(whole.replay_commands) != len(actions):
        return {"reward": None, "error": f"diverged: {len(actions)} bash calls but {len(whole.replay_commands)} "
                                         "commands read back"}  # fmt: skip
    whole.replay_timeouts = [t or (recovery_timeout if rec else prefix_timeout) for _, t, rec in actions]
    made = None
    try:
        made = await materialize(whole, 1, lambda tag: make_environment(environment, task_dir, "replaycheck"),
                                 method="replay", default_timeout=prefix_timeout, stop_environment=stop_quietly)  # fmt: skip
        if not made.environments:
            return {"reward": None, "error": f"diverged: {made.detail}"[:500]}
        outcome = await run_verifier(made.environments[0], task_dir)
        return {"reward": outcome.reward, "error": outcome.error}
    except Exception as exc:
        return {"reward": None, "error": f"{type(exc).__name__}: {exc}"[:500]}
    finally:
        if made is not None:
            await made.stop()
