"""The replay check: a record's whole conversation typed again into a fresh sandbox, then the verifier.

A kept recovery must be re-verifiable from the record alone: a fresh environment of the task, every
bash command of ``messages`` (the failure prefix, then the recovery) typed into the kit's terminal in
order with the timeout its tool call gave (else the default of its part), then the task's verifier
(:func:`reterm.agent.episode.run_verifier`). The pipeline drops records whose replay does not reach
reward 1.0 again (for instance a recovery that only worked because a fork carried files but not a
process), counted with the quality filter.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from reterm.agent.episode import run_verifier
from reterm.agent.terminal import TerminalSession
from reterm.data.config import EnvironmentConfig
from reterm.data.environments import make_environment, stop_quietly


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
    """Replay a record in a fresh environment and verify it.

    Returns ``{"reward": float | None, "error": str | None}`` (``error`` for infrastructure faults; the
    environment is always stopped).
    """

    env = make_environment(environment, task_dir, "replaycheck")
    try:
        await env.start(force_build=False)
        session = await TerminalSession.start(env)
        for command, timeout, recovery in record_actions(record):
            await session.run(command, timeout=timeout or (recovery_timeout if recovery else prefix_timeout))
        outcome = await run_verifier(env, task_dir)
        return {"reward": outcome.reward, "error": outcome.error}
    except Exception as exc:
        return {"reward": None, "error": f"{type(exc).__name__}: {exc}"[:500]}
    finally:
        await stop_quietly(env)
