"""A Harbor environment for one task outside a Harbor trial: ``reterm run``, GRPO's replay forks, and the
data pipeline's recovery attempts (``reterm/data/environments.py`` adapts its YAML ``environment:`` to this).

``kind`` is ``local`` (this kit's sandbox), a Harbor environment type (``docker``, ``daytona``, ...) or an
import path ``module:Class``; the environment is built with Harbor's own
:class:`harbor.environments.factory.EnvironmentFactory` and the task's network policy as a Harbor
``Trial`` resolves it, so an episode outside a trial gets the same network as one inside (evaluation).
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path
from typing import Any

LOCAL_ENVIRONMENT = "reterm.sandbox.local:LocalEnvironment"


def make_environment(kind: str, task: Any, trial_dir: Path, *, session_id: str | None = None, **kwargs: Any) -> Any:
    """A new, not yet started Harbor environment for ``task`` whose trial files go to ``trial_dir``.

    Args:
        kind: ``local``, a Harbor environment type name, or an import path ``module:Class``.
        task: a Harbor ``Task``.
        trial_dir: the trial folder (created; Harbor's ``TrialPaths`` layout).
        session_id: a name for logs (default ``<task>__<8 hex>__env``).
        **kwargs: more constructor arguments of the environment class (e.g. the local sandbox's
            ``memory_mb``); a ``network_policy`` here replaces the task's.

    Raises:
        ValueError: an unknown kind.
    """
    from harbor.environments.factory import EnvironmentFactory
    from harbor.models.trial.paths import TrialPaths

    import_path, env_type = environment_kind(kind)  # before anything is made on disk
    paths = TrialPaths(trial_dir)
    paths.mkdir()
    name = str(task.name).split("/")[-1]
    common = dict(
        environment_dir=task.paths.environment_dir,
        environment_name=name,
        session_id=session_id or f"{name}__{uuid.uuid4().hex[:8]}__env",
        trial_paths=paths,
        task_env_config=task.config.environment,
        # the agent phase's policy, as a Harbor Trial resolves it (without it Harbor's default is public)
        network_policy=task.config.agent.explicit_phase_policy() or task.config.environment.resolve_baseline(),
    )
    common.update(kwargs)
    if import_path:
        return EnvironmentFactory.create_environment_from_import_path(import_path, **common)
    return EnvironmentFactory.create_environment(env_type, **common)


def environment_kind(kind: str) -> tuple[str | None, Any]:
    """``(import_path, None)`` for ``local`` or ``module:Class``, ``(None, EnvironmentType)`` for a Harbor type.

    Raises:
        ValueError: naming the kind and the Harbor types there are.
    """
    from harbor.models.environment_type import EnvironmentType

    if kind == "local":
        return LOCAL_ENVIRONMENT, None
    if ":" in kind:
        return kind, None
    try:
        return None, EnvironmentType(kind)
    except ValueError:
        known = ", ".join(t.value for t in EnvironmentType)
        raise ValueError(f"environment {kind!r}: not 'local', a Harbor environment type ({known}) or module:Class") from None


def harbor_environment_config(kind: str, kwargs: dict[str, Any] | None = None, force_build: bool = False) -> Any:
    """Harbor's trial :class:`~harbor.models.trial.config.EnvironmentConfig` for ``kind`` (see
    :func:`environment_kind`; ``local`` is :data:`LOCAL_ENVIRONMENT`), as a Harbor job or trial takes it.

    Raises:
        ValueError: an unknown kind.
    """
    from harbor.models.trial.config import EnvironmentConfig

    import_path, env_type = environment_kind(kind)
    if import_path:
        return EnvironmentConfig(import_path=import_path, kwargs=dict(kwargs or {}), force_build=force_build)
    return EnvironmentConfig(type=env_type, kwargs=dict(kwargs or {}), force_build=force_build)


def quiet_offline_litellm() -> None:
    """Make LiteLLM use its bundled model-cost map (the kit prices no tokens) instead of fetching it,
    which offline retries for about 19 s per run with warnings after the results: sets
    ``LITELLM_LOCAL_MODEL_COST_MAP=True`` unless the caller set it. Call before Harbor imports LiteLLM."""
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
