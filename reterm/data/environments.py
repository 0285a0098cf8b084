"""Environments for one task outside a Harbor trial: the local sandbox, or any Harbor environment.

The rollout stage lets Harbor's ``Job`` make its environments (:func:`harbor_environment_config`, the same
translation as the evaluation's, :func:`reterm.agent.environments.harbor_environment_config`); recovery
attempts and injected runs need environments of their own (a failure state is rebuilt in a fresh one),
built here from the YAML ``environment:`` by the kit's one builder, :func:`reterm.agent.environments.make_environment`. ``local`` is
:class:`reterm.sandbox.local.LocalEnvironment` (snapshot + fork); a recipe names environments the same way
everywhere, and every episode gets its task's network policy.
"""

from __future__ import annotations

import shutil
import tempfile
import uuid
from pathlib import Path
from typing import Any

from reterm.agent import environments as agent_environments
from reterm.data.config import EnvironmentConfig
from reterm.recovery.materialize import can_fork  # noqa: F401  (still importable here; defined with the rebuild)

_TRIAL_PREFIX = "reterm-pipeline-"  # trial folders of make_environment (removed by stop_quietly)


def harbor_environment_config(spec: EnvironmentConfig) -> Any:
    """Harbor's trial ``EnvironmentConfig`` for ``spec`` (``local`` = the kit's sandbox class)."""
    return agent_environments.harbor_environment_config(spec.type, spec.kwargs)


def make_environment(spec: EnvironmentConfig, task_dir: str | Path, tag: str = "") -> Any:
    """A new, not yet started environment for the task in ``task_dir``, built by the kit's one builder
    (:func:`reterm.agent.environments.make_environment`: Harbor's factory, the task's network policy).

    Its trial files go to a temporary folder that :func:`stop_quietly` removes.

    Args:
        spec: where it runs (``type``, and ``kwargs`` for the environment's constructor).
        task_dir: the Harbor task folder.
        tag: added to the session id (logs).

    Raises:
        ValueError: not a task folder, or an environment type Harbor does not know.
    """
    from harbor.models.task.task import Task

    task_dir = Path(task_dir)
    task = Task(task_dir)
    trial_dir = Path(tempfile.mkdtemp(prefix=f"{_TRIAL_PREFIX}{task_dir.name}-"))
    session = f"{task_dir.name}__{tag or 'pipeline'}__{uuid.uuid4().hex[:6]}"
    try:
        return agent_environments.make_environment(spec.type, task, trial_dir, session_id=session, **spec.kwargs)
    except BaseException:
        shutil.rmtree(trial_dir, ignore_errors=True)
        raise


async def stop_quietly(environment: Any) -> None:
    """Stop an environment, ignoring errors (clean-up paths); removes the trial folder :func:`make_environment` made."""
    try:
        await environment.stop(delete=True)
    except Exception:
        pass
    trial_dir = getattr(getattr(environment, "trial_paths", None), "trial_dir", None)
    if trial_dir is not None and Path(trial_dir).name.startswith(_TRIAL_PREFIX):
        shutil.rmtree(trial_dir, ignore_errors=True)
