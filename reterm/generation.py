"""One set of generation defaults for every harness of the kit.

``reterm run``, ``reterm serve``, the Harbor agent (:mod:`reterm.agent.harbor`), the drills evaluation
(:mod:`reterm.eval.drills`) and ReTerm-GRPO's config (:mod:`reterm.training.grpo_config`) read their defaults
here, so that a model behaves the same whichever harness drives it; each stays overridable (flags, ``--ak``,
recipe keys). The values are the kit's default CPU setting (the embedded SmolLM2 and its checkpoints); the
Qwen3.5-9B recipes set their own caps explicitly.

- :data:`MAX_TURN_TOKENS`: tokens generated per turn at most (end-of-turn token included).
- :data:`TEMPERATURE`: ``0`` (greedy) wherever a model is run to be measured or used; GRPO samples at its
  recipe's temperature instead (a group of equal attempts has no gradient).
- :data:`MAX_CONSECUTIVE_PARSE_ERRORS`: an episode stops after this many replies in a row without a valid tool
  call (stop reason ``parse_errors``; a model that cannot write the format would otherwise spend the task's
  whole time budget on it).
- :data:`THREAD_ENV`: ``OMP_WAIT_POLICY=PASSIVE``. OpenMP threads that spin while waiting make CPU generation
  several times slower on a shared machine (measured: a 64-token SmolLM2 turn at load 8 on two cores, 70 s
  spinning vs 13 s passive; a Harbor first turn 28-53 s vs 5.7 s). OpenMP reads it when torch loads, so
  :func:`apply_thread_policy` must run before that.

:func:`harbor_agent_args` is the ``--ak`` line that gives a Harbor trial the evaluation's settings (the README
quotes it; a test checks they agree).
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

MAX_TURN_TOKENS = 96
"""Tokens generated per turn at most: the drills evaluation's cap (``python -m eval.drills --max-new-tokens``),
and the default of ``reterm run``, ``reterm serve``, the Harbor agent and GRPO's ``max_turn_tokens``. Every drill's
reference tool call fits (the longest is 83 SmolLM2 tokens; ``tests/test_caps.py``): a smaller cap makes items
unwinnable for every model (issue 24)."""

TEMPERATURE = 0.0
"""Sampling temperature of measured and served runs: greedy."""

TOP_P = 0.95
"""Nucleus mass when a caller samples (``temperature > 0``)."""

MAX_CONSECUTIVE_PARSE_ERRORS = 2
"""Replies in a row without a valid tool call after which an episode stops (``0``/``None``: never)."""

THREAD_ENV = {"OMP_WAIT_POLICY": "PASSIVE"}
"""Environment variables of the thread policy, set unless the user chose a value."""



def apply_thread_policy() -> bool:
    """Set :data:`THREAD_ENV` in ``os.environ`` where the user has not chosen a value.

    Returns:
        True when it can still take effect (torch not imported yet in this process), else False: OpenMP has
        already read its settings.
    """
    for key, value in THREAD_ENV.items():
        os.environ.setdefault(key, value)
    return "torch" not in sys.modules


def is_generating(spec: str) -> bool:
    """Whether a policy spec (:func:`reterm.policies.load_policy`) names a model this process generates with
    (``smollm2``, ``hf:...``, a local path). ``oracle`` replays a script; an ``openai:`` endpoint generates on
    its server, whose defaults apply (``reterm serve`` has these same ones; a vLLM server of the 9B recipe its
    own caps), so neither gets these keywords unless the caller passes them."""
    spec = (spec or "").strip()
    return spec == "smollm2" or spec.startswith("hf:") or spec.startswith(("/", ".", "~"))


def policy_defaults(spec: str, **overrides: Any) -> dict[str, Any]:
    """Keyword arguments for :func:`reterm.policies.load_policy`: the shared ``temperature`` and
    ``max_new_tokens`` for a local model (:func:`is_generating`; none for ``oracle`` or ``openai:``), then
    ``overrides`` (which win)."""
    base: dict[str, Any] = {"temperature": TEMPERATURE, "max_new_tokens": MAX_TURN_TOKENS} if is_generating(spec) else {}
    return {**base, **overrides}


def harbor_agent_args(max_turns: int | None = None) -> str:
    """The ``--ak`` arguments that give Harbor's run of :class:`reterm.agent.harbor.ReTermAgent` the
    evaluation's generation settings (the agent's defaults are the same; the line makes them explicit)."""
    kwargs = json.dumps({"temperature": TEMPERATURE, "max_new_tokens": MAX_TURN_TOKENS}, separators=(", ", ": "))
    line = f"--ak 'policy_kwargs={kwargs}' --ak max_consecutive_parse_errors={MAX_CONSECUTIVE_PARSE_ERRORS}"
    return line + (f" --ak max_turns={max_turns}" if max_turns is not None else "")
