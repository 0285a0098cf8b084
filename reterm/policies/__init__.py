"""Policies: what writes the agent's next turn (see :mod:`reterm.policies.base` for the interface).

- :class:`~reterm.policies.transformers_policy.TransformersPolicy`: a local transformers model
  (the embedded SmolLM2 default, any Hub id or folder, Qwen3.5 text-only, PEFT adapters).
- :class:`~reterm.policies.endpoint.EndpointPolicy`: any OpenAI-compatible chat-completions server.
- :class:`~reterm.policies.scripted.ScriptedPolicy` / :class:`~reterm.policies.scripted.OraclePolicy`:
  command lists and the ``solution/solve.sh`` replay.

:func:`load_policy` builds one from a short spec string (CLI flags, recipes, Harbor ``--ak policy=...``).
Heavy imports (torch, transformers, openai) happen only when the matching policy is built.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from reterm.policies.base import FINISH_CONTEXT_LENGTH, EndpointError, Generation, Policy
from reterm.policies.sampling import SamplingParams

__all__ = ["FINISH_CONTEXT_LENGTH", "EndpointError", "Generation", "Policy", "SamplingParams", "load_policy",
           "POLICY_SPECS", "check_policy_spec"]  # fmt: skip

POLICY_SPECS = {
    "smollm2": "the embedded default model SmolLM2-135M-Instruct (local, CPU is enough)",
    "hf:<path-or-hub-id>": "a local transformers model (Qwen3.5 loads text-only); kwargs: adapter=PATH, dtype, device, ...",
    "openai:<model>": "an OpenAI-compatible server; kwargs: base_url=URL (default $OPENAI_BASE_URL or "
    "http://127.0.0.1:8000/v1), api_key_env=VAR (default OPENAI_API_KEY)",
    "oracle": "replays the task's solution/solve.sh; kwargs: tasks=TASK_DIR or a list of them",
}


def check_policy_spec(spec: str) -> str:
    """The stripped ``spec`` if it has one of the :data:`POLICY_SPECS` forms, without building anything
    (for config validation: a typo fails at load time, not in every trial).

    Raises:
        ValueError: an unknown or incomplete spec (the message lists the known forms).
    """
    spec = (spec or "").strip()
    if spec in ("smollm2", "oracle"):
        return spec
    for prefix, what in (("hf:", "a model: hf:<local-path-or-hub-id>"),
                         ("openai:", "the served model name: openai:<model>")):  # fmt: skip
        if spec.startswith(prefix):
            if not spec[len(prefix) :]:
                raise ValueError(f"policy spec {prefix!r} needs {what}")
            return spec
    known = "\n".join(f"  {k}: {v}" for k, v in POLICY_SPECS.items())
    raise ValueError(f"unknown policy spec {spec!r}; known specs:\n{known}")


def load_policy(spec: str, **kwargs: Any) -> Policy:
    """Build a policy from a spec string.

    Specs (see :data:`POLICY_SPECS`):
        ``"smollm2"``: :class:`TransformersPolicy` on the embedded default model.
        ``"hf:<path-or-id>"``: :class:`TransformersPolicy` (``adapter=PATH`` adds a PEFT adapter;
        ``hf:smollm2`` is the embedded model too).
        ``"openai:<model>"``: :class:`EndpointPolicy` (``base_url=...``; the API key is read from the
        environment variable named by ``api_key_env``, default ``OPENAI_API_KEY``).
        ``"oracle"``: :class:`OraclePolicy` (``tasks=`` one task folder/object or a list; ``task=`` is
        accepted too).

    Args:
        spec: the spec string.
        **kwargs: passed to the policy's constructor (sampling parameters, ``name``, ...).

    Returns:
        The policy.

    Raises:
        ValueError: an unknown or incomplete spec, a local model folder (`hf:/...`, `hf:./...`) that does not
            exist, or a missing required keyword (named in the message).
    """
    spec = (spec or "").strip()
    if spec == "smollm2" or spec.startswith("hf:"):
        from reterm.policies.transformers_policy import TransformersPolicy

        model = spec[3:] if spec.startswith("hf:") else "smollm2"
        if not model:
            raise ValueError("policy spec 'hf:' needs a model: hf:<local-path-or-hub-id>")
        if model.startswith(("/", "./", "../", "~")) and not Path(model).expanduser().exists():
            raise ValueError(f"policy spec {spec!r}: no such model folder {model}")
        return TransformersPolicy(model, **kwargs)
    if spec.startswith("openai:"):
        from reterm.policies.endpoint import EndpointPolicy

        model = spec[len("openai:") :]
        if not model:
            raise ValueError("policy spec 'openai:' needs the served model name: openai:<model>")
        return EndpointPolicy(model, **kwargs)
    if spec == "oracle":
        from reterm.policies.scripted import OraclePolicy

        tasks = kwargs.pop("tasks", None)
        task = kwargs.pop("task", None)
        if tasks is None and task is None:
            raise ValueError("policy 'oracle' needs the task(s) whose solution it replays: tasks=TASK_DIR")
        return OraclePolicy(tasks if tasks is not None else task, **kwargs)
    known = "\n".join(f"  {k}: {v}" for k, v in POLICY_SPECS.items())
    raise ValueError(f"unknown policy spec {spec!r}; known specs:\n{known}")
