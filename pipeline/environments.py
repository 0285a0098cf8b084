"""Environments for one task outside a Harbor trial: the local sandbox, or any Harbor environment.

The rollout stage lets Harbor's ``Job`` make its environments; recovery attempts and injected runs need
environments of their own (a failure state is rebuilt in a fresh one). ``local`` is
:class:`reterm.sandbox.local.LocalEnvironment` (snapshot + fork); every other type goes through Harbor's
:class:`harbor.environments.factory.EnvironmentFactory` with the same config translation as the
evaluation (:func:`eval.run.harbor_environment`), so a recipe names environments the same way everywhere.
"""

from __future__ import annotations

import tempfile
import uuid
from pathlib import Path
from typing import Any

from pipeline.config import EnvironmentConfig


def harbor_environment_config(spec: EnvironmentConfig) -> Any:
    """Harbor's trial ``EnvironmentConfig`` for ``spec`` (``local`` = the kit's sandbox class)."""
    from eval.run import EnvironmentSpec, harbor_environment

    return harbor_environment(EnvironmentSpec(type=spec.type, kwargs=dict(spec.kwargs)))


def make_environment(spec: EnvironmentConfig, task_dir: str | Path, tag: str = "") -> Any:
    """A new, not yet started environment for the task in ``task_dir``.

    Args:
        spec: where it runs.
        task_dir: the Harbor task folder.
        tag: added to the session id (logs).

    Raises:
        ValueError: not a task folder, or an environment type Harbor does not know.
    """
    task_dir = Path(task_dir)
    session = f"{task_dir.name}__{tag or 'pipeline'}__{uuid.uuid4().hex[:6]}"
    if spec.type == "local":
        from reterm.sandbox.local import LocalEnvironment

        return LocalEnvironment.for_task(task_dir, session_id=session, **spec.kwargs)
    from harbor.environments.factory import EnvironmentFactory
    from harbor.models.task.task import Task
    from harbor.models.trial.paths import TrialPaths

    task = Task(task_dir)
    paths = TrialPaths(Path(tempfile.mkdtemp(prefix=f"reterm-pipeline-{task_dir.name}-")))
    paths.mkdir()
    return EnvironmentFactory.create_environment_from_config(
        harbor_environment_config(spec),
        environment_dir=task.paths.environment_dir,
        environment_name=task.short_name,
        session_id=session,
        trial_paths=paths,
        task_env_config=task.config.environment,
    )


def can_fork(environment: Any) -> bool:
    """True for environments with a snapshot fork (the local sandbox); others are rebuilt by replay."""
    return callable(getattr(environment, "fork", None)) and callable(getattr(environment, "snapshot", None))


async def stop_quietly(environment: Any) -> None:
    """Stop an environment, ignoring errors (clean-up paths)."""
    try:
        await environment.stop(delete=True)
    except Exception:
        pass
