"""A Harbor environment for one task outside a Harbor trial, by kind name: ``reterm run``, GRPO's replay forks.

``kind`` is ``local`` (this kit's sandbox), a Harbor environment type (``docker``, ``daytona``, ...) or an
import path ``module:Class``; the environment is built with Harbor's own
:class:`harbor.environments.factory.EnvironmentFactory` and the task's network policy as a Harbor
``Trial`` resolves it. (The data pipeline builds its environments from its YAML config instead:
``pipeline/environments.py``.)
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

LOCAL_ENVIRONMENT = "reterm.sandbox.local:LocalEnvironment"


def make_environment(kind: str, task: Any, trial_dir: Path) -> Any:
    """A Harbor environment for ``task`` (a Harbor ``Task``) whose trial files go to ``trial_dir``.

    ``kind``: ``local``, a Harbor environment type name, or an import path ``module:Class``.
    Raises ``ValueError`` for an unknown kind.
    """
    from harbor.environments.factory import EnvironmentFactory
    from harbor.models.environment_type import EnvironmentType
    from harbor.models.trial.paths import TrialPaths

    paths = TrialPaths(trial_dir)
    paths.mkdir()
    name = str(task.name).split("/")[-1]
    common = dict(
        environment_dir=task.paths.environment_dir,
        environment_name=name,
        session_id=f"{name}__{uuid.uuid4().hex[:8]}__env",
        trial_paths=paths,
        task_env_config=task.config.environment,
        # the agent phase's policy, as a Harbor Trial resolves it (without it Harbor's default is public)
        network_policy=task.config.agent.explicit_phase_policy() or task.config.environment.resolve_baseline(),
    )
    import_path = LOCAL_ENVIRONMENT if kind == "local" else kind if ":" in kind else None
    if import_path:
        return EnvironmentFactory.create_environment_from_import_path(import_path, **common)
    try:
        env_type = EnvironmentType(kind)
    except ValueError:
        known = ", ".join(t.value for t in EnvironmentType)
        raise ValueError(f"environment {kind!r}: not 'local', a Harbor environment type ({known}) or module:Class") from None
    return EnvironmentFactory.create_environment(env_type, **common)
