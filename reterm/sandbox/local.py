"""``reterm.sandbox.local:LocalEnvironment``: a Harbor environment without a container engine,
with snapshot and fork.

Use it from Harbor (``harbor run -p TASK -a oracle -e reterm.sandbox.local:LocalEnvironment``) or
directly::

    env = LocalEnvironment.for_task("tasks/hello-file")
    async with env:                               # start(force_build=False) ... stop(delete=True)
        r = await env.exec("echo hi > /app/x && cat /app/x")
        snap = await env.snapshot()               # files only; the source keeps running
        forks = await env.fork(4)                 # 4 started, independent sandboxes
        more = await LocalEnvironment.from_snapshot(snap, 2)
        ...
        for f in forks + more: await f.stop(delete=True)
        snap.release()

What it is (measured figures in ``bench/sandbox_fork.py``, limits in docs/SANDBOX.md):
bubblewrap namespaces over overlayfs layers (Debian base from debootstrap, the task's build layer,
snapshots, a size-limited writable tmpfs), cgroup limits, loopback-only network; as root, or without
root in an unprivileged user namespace (rootless mode, :mod:`reterm.sandbox.rootless`). It is not a VM
and not the task's own image: ``FROM debian|ubuntu|python`` map onto a Debian 12 base (``FROM debian:13``: a
Debian 13 base).

Network policy (Harbor's ``NetworkPolicy``; docs/SANDBOX.md, Network): by default trials run without a
network (only ``lo``; a server on the host's 127.0.0.1 is unreachable), ``no-network`` exactly and a
``public`` phase (Harbor's default when a task says nothing) too, with a warning once per process. Options
(``--ek``): ``public_network=host`` gives a sandbox whose phases are all ``public`` the host's network
(its localhost is then the host's); ``public_network=error`` rejects such tasks. ``allowlist`` policies
are rejected by Harbor's own check. Offline, every host name a sandbox looks up is recorded
(:mod:`reterm.sandbox.network`) in ``<trial>/`` :data:`NETWORK_LOG`, so that a verifier or reference
solution that failed for want of a host is an infrastructure fault naming it
(:mod:`reterm.agent.trial_outcome`); right after such a verifier this environment raises
:class:`~reterm.sandbox.faults.NetworkUnreachableError`, so Harbor's result.json records the fault naming the
hosts instead of a reward of 0 (option ``network_faults``). The offline verifier shim (:mod:`reterm.sandbox.shim`) applies to
the verifier's ``tests/test.sh`` in every trial (``verifier_shim=false`` turns it off).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import shlex
import tarfile
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any, Literal

from harbor.environments.base import BaseEnvironment, ExecResult, transfer_tar_filter
from harbor.environments.capabilities import EnvironmentCapabilities, EnvironmentResourceCapabilities
from harbor.environments.options import EnvironmentOptions
from harbor.models.task.config import EnvironmentConfig, NetworkMode, NetworkPolicy
from harbor.models.trial.config import ResourceMode
from harbor.models.trial.paths import EnvironmentPaths, TrialPaths
from pydantic import Field

from reterm.sandbox import snapshot as snapmod
from reterm.sandbox.base_image import ensure_base
from reterm.sandbox.box import (
    CA_ENV_VARS,
    DEFAULT_PATH,
    HOST_CA_PATH,
    Box,
    BoxHealth,
    BoxSpec,
    ExecTimeoutError,
    SandboxError,
    default_pids_max,
    host_ca_bundle,
)
from reterm.sandbox.build import TaskLayer, base_suite, ensure_layer
from reterm.sandbox.faults import (
    NetworkUnreachableError,
    StandInBaseError,
    WritableLayerFullError,
    phase_base_fault,
    phase_network_fault,
    phase_storage_fault,
    verifier_install_storage_fault,
    written_reward,
)
from reterm.sandbox.network import NETWORK_LOG, recorder
from reterm.sandbox.paths import rmtree_writable
from reterm.sandbox.preflight import missing_tools, require_root_or_explain
from reterm.sandbox.rootless import require_rootless_or_explain, sandbox_mode
from reterm.sandbox.shim import MISSING_LOG, SHIM_BASH_ENV, SHIM_TARGET, shim_dir
from reterm.sandbox.snapshot import Snapshot
from reterm.sandbox.sweep import sweep_once

logger = logging.getLogger(__name__)
_warned_public = False

DEFAULT_MEMORY_MB = 4096
DEFAULT_STORAGE_MB = 4096


def memory_headroom_mb(memory_mb: int) -> int:
    """Memory kept free of the writable layer: a quarter of the limit, at least 256 MiB.

    The writable layer is a tmpfs whose pages count against the sandbox's memory limit, so a layer as
    large as the limit lets a disk fill (``dd if=/dev/zero of=/big``) reach the limit first: the OOM
    killer then ends the agent's shell and terminal, and nothing can start again while the tmpfs holds
    the memory. With the layer capped at ``memory_mb - headroom``, a disk fill ends with "No space
    left on device" and the shell keeps this much memory to recover in.
    """
    return max(256, memory_mb // 4)


def effective_storage_mb(storage_mb: int, memory_mb: int | None) -> int:
    """The writable layer's size: ``storage_mb``, capped at ``memory_mb - memory_headroom_mb(memory_mb)``
    (a cap of at least 64 MiB) when a memory limit applies."""
    if not memory_mb:
        return storage_mb
    return min(storage_mb, max(64, memory_mb - memory_headroom_mb(memory_mb)))


class LocalOptions(EnvironmentOptions):
    """``--ek`` options of the local sandbox (all optional)."""

    memory_mb: int | None = Field(default=None, description="memory limit (MiB) incl. the writable tmpfs; "
                                  "default: the task's memory_mb, else 4096")  # fmt: skip
    storage_mb: int | None = Field(default=None, description="size of the writable layer (MiB); "
                                   "default: the task's storage_mb, else 4096; at most memory_mb less "
                                   "a quarter (min 256 MiB), as the layer lives in memory")  # fmt: skip
    pids_max: int | None = Field(default=None, description="most processes/threads at once (fork bombs stop here); "
                                 "default: the host budget's pids / 8, at most 4096")  # fmt: skip
    max_output_bytes: int = Field(default=8 * 2**20, description="per-stream exec output kept (head+tail)")
    public_network: Literal["offline", "host", "error"] = Field(
        default="offline",
        description="a task whose phases allow internet (network_mode public, Harbor's default): run it "
        "offline; give it the host's network (host: every phase must be public, as the sandbox cannot switch "
        "its network after start; its localhost is then the host's); or reject it (error)",
    )
    network_faults: bool = Field(
        default=True,
        description="after the verifier, raise NetworkUnreachableError (Harbor records it in result.json, no "
        "reward) when the reward is below 1 and the verifier or reference solution failed for want of a host "
        "its public phase asked for, or StandInBaseError when one of them asked apt for what the stand-in base "
        "lacks, or WritableLayerFullError when the reference solution filled the writable layer, or the "
        "verifier's package install did while the layer was at most half full "
        "(reterm/sandbox/faults.py); false: leave the reward as the verifier wrote it",
    )
    verifier_shim: bool = Field(
        default=True,
        description="run the verifier's tests/test.sh with the offline verifier shim (uv's installer served "
        "locally, uv/uvx/pytest/CTRF from the sandbox's Python; reterm/sandbox/shim/README.md)",
    )


class LocalEnvironment(BaseEnvironment):
    """Harbor ``BaseEnvironment`` backed by :class:`reterm.sandbox.box.Box` (see module doc).

    Extra API beyond Harbor's: :meth:`for_task`, ``async with``, :meth:`snapshot`, :meth:`fork`,
    :meth:`from_snapshot`, :attr:`box`. ``exec`` raises :class:`ExecTimeoutError` (a
    ``RuntimeError``, like Harbor's docker environment) after killing the command's process tree.
    """

    options_model = LocalOptions
    options: LocalOptions

    def __init__(
        self,
        environment_dir: Path,
        environment_name: str,
        session_id: str,
        trial_paths: TrialPaths,
        task_env_config: EnvironmentConfig,
        **kwargs: Any,
    ) -> None:
        self._box: Box | None = None
        self._layer: TaskLayer | None = None
        self._snapshot: Snapshot | None = kwargs.pop("_snapshot", None)
        self._owned_dirs: list[Path] = kwargs.pop("_owned_dirs", [])
        self._lease: Path | None = None
        self._image_user: str | None = None
        self._image_env: dict[str, str] = {}
        self._workdir: str | None = None
        self._lookups: list[tuple[float, str]] = []
        self._dns_sock: Any = None
        self._solution_window: tuple[float, float] | None = None
        super().__init__(environment_dir, environment_name, session_id, trial_paths, task_env_config, **kwargs)
        self._check_policies([self._network_policy, *self._phase_network_policies])

    # ------------------------------------------------------------------------ Harbor hooks
    @staticmethod
    def type() -> str:
        return "reterm-local"

    @property
    def capabilities(self) -> EnvironmentCapabilities:
        # With the host's network the sandbox's network is fixed at start: Harbor then infers one policy for
        # all phases and refuses a task that mixes public and restricted phases (its own check).
        host = getattr(self, "options", None) is not None and self.options.public_network == "host"
        return EnvironmentCapabilities(disable_internet=True, dynamic_network_policy=not host, mounted=True)

    @property
    def host_network(self) -> bool:
        """True when this sandbox runs on the host's network (``public_network=host`` and a public policy)."""
        return self.options.public_network == "host" and self._network_policy.network_mode == NetworkMode.PUBLIC

    def unreachable_lookups(self) -> list[tuple[float, str]]:
        """``(unix time, host name)`` of every name this sandbox looked up while offline (none resolves)."""
        return list(self._lookups)

    @classmethod
    def resource_capabilities(cls) -> EnvironmentResourceCapabilities:
        return EnvironmentResourceCapabilities(cpu_limit=True, memory_limit=True, fractional_cpus=True)

    @classmethod
    def preflight(cls, kwargs: dict[str, Any] | None = None) -> None:
        super().preflight(kwargs)

        if missing := missing_tools():
            raise SystemExit(f"the local sandbox needs: {', '.join(missing)} (run scripts/setup.sh)")
        try:
            if sandbox_mode() == "rootless":
                require_rootless_or_explain()
            elif os.geteuid() != 0:
                require_root_or_explain()
        except (SandboxError, ValueError) as exc:
            raise SystemExit(str(exc)) from None

    def _validate_definition(self) -> None:
        if self._snapshot is not None:
            return
        if not (self.environment_dir / "Dockerfile").is_file() and not self.task_env_config.docker_image:
            raise FileNotFoundError(
                f"{self.environment_dir}: the local sandbox builds from environment/Dockerfile "
                "(or task.toml [environment] docker_image); neither is present"
            )
        if (self.environment_dir / "docker-compose.yaml").exists():
            raise ValueError(
                f"{self.environment_dir / 'docker-compose.yaml'}: multi-container tasks are not supported by the "
                "local sandbox (it runs one sandbox per task); use -e docker"
            )

    def _check_policies(self, policies: list[NetworkPolicy]) -> None:
        global _warned_public
        for p in policies:
            if p.network_mode != NetworkMode.PUBLIC:
                continue
            if self.options.public_network == "error":
                raise ValueError(
                    f"task {self.environment_name} allows internet access in a phase, but the local sandbox runs "
                    "offline (public_network=error). Use --ek public_network=offline to run it offline, or "
                    "--ek public_network=host to give it the host's network."
                )
            if self.options.public_network == "host":
                continue
            if not _warned_public:
                _warned_public = True
                logger.warning(
                    "task %s allows internet access; the local sandbox runs every trial offline (loopback only)",
                    self.environment_name,
                )

    async def _apply_network_policy(self, network_policy: NetworkPolicy) -> None:
        self._check_policies([network_policy])  # offline whatever the phase asks; nothing to switch
        self._net_log({"event": "policy", "policy": network_policy.network_mode.value})

    def _net_log(self, record: dict) -> None:
        """Append ``record`` (with the time) to ``<trial>/`` :data:`NETWORK_LOG`: the phases' network policies and
        the host names looked up offline, which :mod:`reterm.agent.trial_outcome` reads."""
        with contextlib.suppress(OSError):
            with open(self.trial_paths.trial_dir / NETWORK_LOG, "a") as fh:
                fh.write(json.dumps({"t": round(time.time(), 3), **record}) + "\n")

    # -------------------------------------------------------------------- construction
    @classmethod
    def for_task(
        cls,
        task_dir: str | Path,
        *,
        workdir: str | None = None,
        session_id: str | None = None,
        trial_dir: str | Path | None = None,
        **kwargs: Any,
    ) -> "LocalEnvironment":
        """An un-started environment for a Harbor task folder, without a Harbor Trial.

        Args:
            task_dir: folder with ``task.toml`` and ``environment/Dockerfile``.
            workdir: default working directory of ``exec`` (overrides the task's and WORKDIR).
            session_id: a name for logs (default ``<task>__<8 hex>``).
            trial_dir: where Harbor-style trial output goes (default: a temporary folder,
                removed at stop).
            **kwargs: more ``BaseEnvironment`` / :class:`LocalOptions` arguments
                (``persistent_env``, ``memory_mb``, ...).

        Raises:
            FileNotFoundError / ValueError: not a task folder, or ``task.toml`` is invalid.
        """
        from harbor.models.task.task import Task

        task = Task(task_dir, disable_verification=True)
        cfg = task.config.environment.model_copy(deep=True)
        if workdir is not None:
            cfg.workdir = workdir
        owned = []
        if trial_dir is None:
            trial_dir = Path(tempfile.mkdtemp(prefix=f"reterm-trial-{task.short_name}-"))
            owned.append(trial_dir)
        paths = TrialPaths(Path(trial_dir))
        paths.mkdir()
        # the agent phase's policy, as a Harbor Trial would resolve it (offline either way)
        kwargs.setdefault("network_policy", task.config.agent.explicit_phase_policy() or cfg.resolve_baseline())
        return cls(
            environment_dir=task.paths.environment_dir,
            environment_name=task.short_name,
            session_id=session_id or f"{task.short_name}__{uuid.uuid4().hex[:8]}",
            trial_paths=paths,
            task_env_config=cfg,
            _owned_dirs=owned,
            **kwargs,
        )

    async def __aenter__(self) -> "LocalEnvironment":
        if self._box is None:
            await self.start(force_build=False)
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.stop(delete=True)

    # ----------------------------------------------------------------------- lifecycle
    @property
    def box(self) -> Box:
        """The running sandbox (raises :class:`SandboxError` before start / after stop)."""
        if self._box is None:
            raise SandboxError(f"environment {self.session_id} is not started")
        return self._box

    def sandbox_health(self) -> BoxHealth:
        """:meth:`reterm.sandbox.box.Box.health` of the sandbox (``alive=False`` before start and after
        stop): whether it still runs and which of its own limits (memory, pids, storage) it ran into.
        The episode loop uses it to tell what the agent broke from what the host or harness did."""
        return self._box.health() if self._box is not None else BoxHealth(alive=False)

    @property
    def workdir(self) -> str | None:
        """Default working directory of ``exec`` (task workdir, else the Dockerfile's WORKDIR)."""
        return self._workdir

    def _limits(self) -> dict:
        cfg = self.task_env_config
        task_mem = self._resource_limit_value("memory", auto_mode=ResourceMode.LIMIT)
        mem = self.options.memory_mb or task_mem or DEFAULT_MEMORY_MB
        storage = int(self.options.storage_mb or cfg.storage_mb or DEFAULT_STORAGE_MB)
        return {
            "memory_mb": int(mem),
            "storage_mb": effective_storage_mb(storage, int(mem)),
            "pids_max": self.options.pids_max or default_pids_max(),
            "cpus": self._resource_limit_value("cpu", auto_mode=ResourceMode.LIMIT),
        }

    async def start(self, force_build: bool) -> None:
        """Build (or reuse) the layers and start the sandbox (70-120 ms here once layers are cached).

        Raises:
            DockerfileError / SandboxBuildFailedError: the task cannot be built (file and line named).
            SandboxError: the sandbox could not start (nothing is left running).
        """
        if self._box is not None:
            raise SandboxError(f"environment {self.session_id} is already started")
        await asyncio.to_thread(sweep_once)
        if self._snapshot is not None:
            meta = self._snapshot.meta
            if (snap_mode := meta.get("mode", "root")) != (mode := sandbox_mode()):
                raise SandboxError(
                    f"snapshot {self._snapshot.id} was taken in {snap_mode} mode and this process runs sandboxes "
                    f"in {mode} mode (RETERM_SANDBOX_MODE): its layers cannot be shared between the two. "
                    "Nothing was started."
                )
            lowers = self._snapshot.lowers
            self._image_user, self._image_env = meta.get("image_user"), dict(meta.get("image_env", {}))
            layer_workdir = meta.get("layer_workdir")
            self._lease = snapmod.take_lease(self._snapshot.path)
        else:
            suite = base_suite(self.environment_dir, self.task_env_config.docker_image)
            base = await asyncio.to_thread(ensure_base, suite=suite, log=logger.info)
            self._layer = await ensure_layer(
                self.environment_dir, base, docker_image=self.task_env_config.docker_image,
                force=force_build, log=logger.info,
            )  # fmt: skip
            lowers = [self._layer.root, base.rootfs]
            self._image_user, self._image_env = self._layer.user, self._layer.env
            layer_workdir = self._layer.workdir
        self._layer_workdir = layer_workdir
        self._workdir = self.task_env_config.workdir or layer_workdir
        binds = []
        if self.options.verifier_shim and not any(str(m.get("target")) == SHIM_TARGET for m in self._host_mounts):
            binds.append((str(await asyncio.to_thread(shim_dir)), SHIM_TARGET, True))
        if self._snapshot is None:
            for m in self._host_mounts:
                if m.get("type", "bind") != "bind":
                    raise ValueError(f"mount type {m.get('type')!r} is not supported by the local sandbox")
                Path(m["source"]).mkdir(parents=True, exist_ok=True)
                binds.append((str(Path(m["source"]).resolve()), str(m["target"]), bool(m.get("read_only"))))
        dirs = [str(d) for d in self._mount_targets(writable_only=True)] or [
            str(EnvironmentPaths.agent_dir), str(EnvironmentPaths.verifier_dir), str(EnvironmentPaths.artifacts_dir)
        ]
        prepare = self._ensure_dirs_command(dirs)  # Harbor's /logs folders (mkdir -p + chmod 777)
        if self._workdir:
            prepare = f"mkdir -p {shlex.quote(self._workdir)} && " + prepare
        spec = BoxSpec(lowers=lowers, binds=binds, prepare=prepare, network=self.host_network, **self._limits())
        # Box.start runs in a worker thread that a cancel cannot stop: on any error or cancel (a Gradio
        # Stop, a Harbor cancel) wait for it and close the box it made, so nothing lives on unowned.
        starting = asyncio.get_running_loop().run_in_executor(None, Box.start, spec)
        try:
            self._box = await asyncio.shield(starting)
            self._box.on_close.append(self._release_lease)
            self._record_lookups(self._box)
            if self._snapshot is None:
                await self._upload_environment_dir_after_start()
        except BaseException:
            if self._box is None:
                try:
                    self._box = await starting
                    self._box.on_close.append(self._release_lease)
                except BaseException:
                    pass
            await self._close()
            raise

    def _record_lookups(self, box: Box) -> None:
        """Record the host names an offline sandbox looks up (root mode; see :mod:`reterm.sandbox.network`)
        into :meth:`unreachable_lookups` and ``<trial>/`` :data:`NETWORK_LOG`, each with the network policy
        the phase asked for (a look-up in a ``no-network`` phase is the task's or the agent's business)."""
        recording = not box.spec.network and box.mode == "root"
        self._net_log({"event": "start", "network": "host" if box.spec.network else "offline",
                       "recording": recording, "policy": self._network_policy.network_mode.value})  # fmt: skip
        if not recording:
            return
        own = {"localhost", box.spec.hostname, "ip6-localhost", "ip6-loopback"}

        def on_lookup(name: str, t: float) -> None:
            if name in own or name.endswith(".localhost"):
                return
            self._lookups.append((t, name))
            self._net_log({"host": name, "policy": self._network_policy.network_mode.value})

        try:
            sock = recorder().watch(box._ns_fds["net"], on_lookup)
        except OSError as exc:  # port 53 taken inside (cannot happen before anything ran), or no privilege
            logger.warning("sandbox %s: host look-ups are not recorded: %s", box.id, exc)
            return
        box.on_close.append(lambda: recorder().unwatch(sock))

    def _release_lease(self) -> None:
        if self._lease is not None:
            snapmod.drop_lease(self._lease)
            self._lease = None

    async def _close(self) -> None:
        if self._box is not None:
            box, self._box = self._box, None
            await asyncio.to_thread(box.close)
        else:
            self._release_lease()

    async def stop(self, delete: bool = True) -> None:
        """Kill every process and remove mounts, cgroups and run folder (always: a stopped local
        sandbox cannot be resumed; ``delete`` is accepted for Harbor). Idempotent."""
        await self._close()
        for d in self._owned_dirs:
            rmtree_writable(d)
        self._owned_dirs = []

    # ---------------------------------------------------------------------------- exec
    def _env_for(self, env: dict[str, str] | None) -> tuple[dict[str, str], bool]:
        merged = self._merge_env(env) or {}
        full = {"PATH": DEFAULT_PATH, "HOSTNAME": "sandbox", "HOME": "/root", **self._image_env, **merged}
        if self._box is not None and self._box.spec.network and host_ca_bundle() is not None:
            # on the host's network, TLS goes through the host's CA bundle (a TLS-intercepting proxy), as in builds
            full = {**{k: HOST_CA_PATH for k in CA_ENV_VARS}, **full}
        explicit_home = "HOME" in self._image_env or "HOME" in merged
        return full, not explicit_home

    async def exec(
        self,
        command: str,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        timeout_sec: int | None = None,
        user: str | int | None = None,
    ) -> ExecResult:
        """Run ``command`` with ``bash -c`` in the sandbox.

        ``user`` (name, uid or ``name:group``) falls back to Harbor's ``default_user``, then to the
        Dockerfile's USER, then root; ``cwd`` to the task workdir / WORKDIR, then ``/``. The process
        environment is PATH/HOME/HOSTNAME + the Dockerfile's ENV + the task's and trial's env + ``env``
        (nothing from the caller's own environment). Output beyond ``max_output_bytes`` per stream
        keeps its head and tail with a note in between.

        Raises:
            ExecTimeoutError: past ``timeout_sec``; the command's process tree was killed.
            SandboxError: the sandbox is not running (an infrastructure fault).
        """
        box = self.box
        full_env, set_home = self._env_for(env)
        if self.options.verifier_shim and "BASH_ENV" not in full_env and _is_verifier_command(command):
            full_env["BASH_ENV"] = SHIM_BASH_ENV
            if box.spec.network:  # the shim may then install what the verifier asks for from the package index
                full_env["RETERM_SHIM_ONLINE"] = "1"
        u = self._resolve_user(user)
        if u is None:
            u = self._image_user
        checks_faults = self.options.network_faults and _is_verifier_command(command)
        used_at_start = await self._layer_used_mb() if checks_faults else None
        started = time.time()
        r = await box.run(
            box.wrap_command(command, user=u, cwd=cwd or self._workdir, set_home=set_home),
            env=full_env, timeout=timeout_sec, max_output_bytes=self.options.max_output_bytes,
            on_output=self._output_callback(),
        )  # fmt: skip
        window = (started, time.time())
        stdout = r.stdout.decode(errors="replace")
        stderr = r.stderr.decode(errors="replace")
        if _is_script_command(command, str(EnvironmentPaths.solution_dir)):
            self._solution_window = window
        if r.timed_out:
            raise ExecTimeoutError(f"Command timed out after {timeout_sec} seconds", stdout, stderr)
        if checks_faults:
            await self._raise_infra_fault(window, used_at_start)
        return ExecResult(stdout=stdout or None, stderr=stderr or None, return_code=r.return_code)

    async def _layer_used_mb(self) -> float | None:
        """MiB in use in the writable layer now (``statfs`` of ``/`` in the sandbox: overlayfs reports its upper
        layer's file system), ``None`` when it cannot be read."""
        try:
            r = await self._root_run(["stat", "-f", "-c", "%b %f %S", "/"])
            blocks, free, size = (int(w) for w in r.stdout.decode().split())
        except (ValueError, OSError, SandboxError):
            return None
        return (blocks - free) * size / 2**20

    async def _raise_infra_fault(self, verifier_window: tuple[float, float], used_at_start_mb: float | None = None
                                 ) -> None:  # fmt: skip
        """Raise :class:`NetworkUnreachableError` when the verifier that just ran wrote a reward below 1 (or
        none) and it, or the reference solution before it, failed for want of a host its ``public`` phase
        asked for (:func:`reterm.sandbox.faults.phase_network_fault`), else :class:`StandInBaseError` when one
        of them asked apt for a package or version the stand-in base lacks
        (:func:`reterm.sandbox.faults.phase_base_fault`), else :class:`WritableLayerFullError` when the reference
        solution ran out of the writable layer (:func:`reterm.sandbox.faults.phase_storage_fault`) or the
        verifier's package install did while the layer held at most half of its size, ``used_at_start_mb``,
        when the verifier began (:func:`reterm.sandbox.faults.verifier_install_storage_fault`). Harbor then
        records the fault in ``result.json`` with no reward instead of scoring 0.

        Reads the verifier's files (reward, output, CTRF report, the shim's missing log) from the sandbox's
        ``/logs/verifier``, copied into the trial's ``verifier/`` first as Harbor does next (so they are there
        when the trial ends with the fault)."""
        verifier_dir = self.trial_paths.verifier_dir
        in_sandbox = str(EnvironmentPaths.verifier_dir)
        if not self.is_path_mounted(EnvironmentPaths.verifier_dir, verifier_dir):
            try:
                await self.download_dir(in_sandbox, verifier_dir)
            except (FileNotFoundError, OSError, tarfile.TarError) as exc:
                logger.warning("sandbox %s: the verifier's files could not be read: %s", self.session_id, exc)
                return
        reward = written_reward(verifier_dir)
        if reward is not None and reward >= 1:
            return
        phases = [("verifier", verifier_window, verifier_dir / "test-stdout.txt")]
        if self._solution_window is not None:
            phases.insert(0, ("solution", self._solution_window, self.trial_paths.agent_dir / "oracle.txt"))
        reason = phase_network_fault(self.trial_paths.trial_dir, phases)
        if reason:  # a host out of reach first: more room would not have made the trial pass
            raise NetworkUnreachableError(reason)
        reason = phase_base_fault([(name, output) for name, _, output in phases])
        if reason:
            raise StandInBaseError(reason)
        storage_mb = self._limits()["storage_mb"]
        solution_output = self.trial_paths.agent_dir / "oracle.txt"
        reason = phase_storage_fault(solution_output, storage_mb) if self._solution_window is not None else None
        reason = reason or verifier_install_storage_fault(verifier_dir / "test-stdout.txt", verifier_dir / MISSING_LOG,
                                                          storage_mb, used_at_start_mb)  # fmt: skip
        if reason:
            raise WritableLayerFullError(reason)

    async def _root_run(self, argv: list[str], **kw) -> Any:
        box = self.box
        full_env, _ = self._env_for(None)
        return await box.run(box.wrap_command(argv, user="root", cwd="/", set_home=False), env=full_env, **kw)

    # ------------------------------------------------------------------------ transfers
    # Paths inside the sandbox are resolved by programs running *inside* it, so a symlink or ".."
    # there can only reach the sandbox's own files. Archives coming out of the sandbox are unpacked
    # on the host with tarfile's "data" filter (no absolute paths, no "..", no links leaving the
    # target, no device files).
    async def upload_file(self, source_path: Path | str, target_path: str) -> None:
        """Copy a host file into the sandbox (into ``target_path`` if that is a folder there), as root."""
        src = Path(source_path)
        if not src.is_file():
            raise FileNotFoundError(f"upload_file: {src} is not a file")
        mode = oct(src.stat().st_mode & 0o777)[2:]
        script = ('t=$1; if [ -d "$t" ]; then t="$t/$2"; else mkdir -p -- "$(dirname -- "$t")" || exit 1; fi; '
                  'cat > "$t" && chmod "$3" "$t"')  # fmt: skip
        r = await self._root_run(["/bin/sh", "-c", script, "sh", target_path, src.name, mode], stdin=src)
        if r.return_code != 0:
            raise RuntimeError(f"upload_file {src} -> {target_path} failed: {r.stderr.decode(errors='replace')}")

    async def upload_dir(self, source_dir: Path | str, target_dir: str) -> None:
        """Copy a host folder's contents into ``target_dir`` (created) in the sandbox, owned by root.

        Symlinks are copied as symlinks (never followed on the host)."""
        src = Path(source_dir)
        if not src.is_dir():
            raise FileNotFoundError(f"upload_dir: {src} is not a folder")
        with tempfile.NamedTemporaryFile(suffix=".tar") as tf:
            with tarfile.open(tf.name, "w") as tar:
                for p in sorted(src.rglob("*")):
                    tar.add(p, arcname=p.relative_to(src).as_posix(), recursive=False, filter=_root_owned)
            q = shlex.quote(target_dir)
            r = await self._root_run(
                ["/bin/sh", "-c", f"mkdir -p -- {q} && tar -xf - -C {q} --numeric-owner"], stdin=Path(tf.name)
            )
        if r.return_code != 0:
            raise RuntimeError(f"upload_dir {src} -> {target_dir} failed: {r.stderr.decode(errors='replace')}")

    async def download_file(self, source_path: str, target_path: Path | str) -> None:
        """Copy a sandbox file to the host (parent folders created).

        Raises:
            FileNotFoundError: ``source_path`` is not a regular file in the sandbox.
        """
        target = Path(target_path)
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{target.name}.{uuid.uuid4().hex[:6]}.part")
        r = await self._root_run(["/bin/sh", "-c", 'test -f "$1" && exec cat -- "$1"', "sh", source_path],
                                 stdout_to=tmp)  # fmt: skip
        if r.return_code != 0:
            tmp.unlink(missing_ok=True)
            raise FileNotFoundError(f"download_file: {source_path} is not a file in sandbox {self.session_id}")
        os.replace(tmp, target)

    async def download_dir(self, source_dir: str, target_dir: Path | str) -> None:
        """Copy a sandbox folder's contents to a host folder (overwriting files there).

        Raises:
            FileNotFoundError: ``source_dir`` is not a folder in the sandbox.
            tarfile.FilterError: an entry would leave ``target_dir`` (e.g. a symlink to /etc).
        """
        target = Path(target_dir)
        target.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix="reterm-dl-") as tmpd:
            tar_path = Path(tmpd) / "d.tar"
            r = await self._root_run(
                ["/bin/sh", "-c", 'test -d "$1" && cd -- "$1" && exec tar -cf - .', "sh", source_dir],
                stdout_to=tar_path,
            )
            if r.return_code != 0:
                raise FileNotFoundError(f"download_dir: {source_dir} is not a folder in sandbox {self.session_id}: "
                                        f"{r.stderr.decode(errors='replace').strip()}")  # fmt: skip
            await asyncio.to_thread(_extract_safely, tar_path, target)

    # ------------------------------------------------------------------- snapshot / fork
    async def snapshot(self, extra: dict | None = None) -> Snapshot:
        """Freeze the sandbox's current files into a stored :class:`Snapshot`; the sandbox keeps running.

        The sandbox's processes are paused (cgroup freezer) during the copy of its writable layer
        (about 50-100 ms for 50 MB here; rootless mode without cgroups copies while they run, see
        docs/SANDBOX.md). Release the snapshot with ``snap.release()`` when done;
        forks started from it keep it alive until they stop.

        Args:
            extra: a JSON-able dict stored in ``snap.meta["extra"]`` (e.g. the agent's cwd).
        """
        box = self.box
        sid, path = snapmod.new_snapshot_dir()
        try:
            frozen_s = await asyncio.to_thread(box.copy_upper, path / "files")
            parents = []
            if self._snapshot is not None:
                parents = [self._snapshot.id, *self._snapshot.meta.get("parents", [])]
                for p in parents:  # a child snapshot keeps its parents' layers alive
                    lease = snapmod.take_lease(snapmod.sub("snapshots") / p, f"snap-{sid}")
                    lease.write_text('{"child_snapshot": "%s"}' % sid)
            meta = {
                "id": sid, "created": time.time(), "source": self.session_id, "mode": box.mode,
                "lowers": [str(p) for p in box.spec.lowers], "parents": parents,
                "copy_s": round(frozen_s, 4), "size_bytes": snapmod.dir_size(path / "files"),
                "environment_dir": str(self.environment_dir), "environment_name": self.environment_name,
                "task_env_config": self.task_env_config.model_dump(mode="json"),
                "image_user": self._image_user, "image_env": self._image_env,
                "layer_workdir": self._layer_workdir, "limits": self._limits(),
                "extra": extra or {},
            }  # fmt: skip
            snapmod.write_meta(path, meta)
        except BaseException:
            rmtree_writable(path)
            raise
        return Snapshot(sid, path, meta)

    async def fork(self, n: int, **kwargs: Any) -> list["LocalEnvironment"]:
        """``n`` started, independent sandboxes with this sandbox's current files.

        Takes a snapshot, starts ``n`` sandboxes from it concurrently and releases it (it is deleted
        when the last fork stops). Running processes are not forked: each fork runs a fresh init.
        Forks never see each other's writes, nor later writes of this sandbox.
        """
        snap = await self.snapshot()
        try:
            return await type(self).from_snapshot(snap, n, persistent_env=dict(self._persistent_env), **kwargs)
        finally:
            snap.release()

    @classmethod
    async def from_snapshot(cls, snap: Snapshot | str | Path, n: int = 1, **kwargs: Any) -> list["LocalEnvironment"]:
        """Start ``n`` sandboxes from a stored snapshot (a :class:`Snapshot`, its id or its folder).

        ``kwargs`` go to the constructor (``persistent_env``, ``memory_mb``, ``session_id`` is
        suffixed with the fork index). If any fork fails to start, the others are stopped and the
        error is raised.
        """
        if not isinstance(snap, Snapshot):
            snap = Snapshot.load(snap)
        envs = [cls._for_snapshot(snap, i, **kwargs) for i in range(n)]
        results = await asyncio.gather(*(e.start(force_build=False) for e in envs), return_exceptions=True)
        errors = [r for r in results if isinstance(r, BaseException)]
        if errors:
            await asyncio.gather(*(e.stop(delete=True) for e in envs), return_exceptions=True)
            raise errors[0]
        return envs

    @classmethod
    def _for_snapshot(cls, snap: Snapshot, index: int, **kwargs: Any) -> "LocalEnvironment":
        meta = snap.meta
        cfg = EnvironmentConfig.model_validate(meta["task_env_config"])
        trial_dir = Path(tempfile.mkdtemp(prefix=f"reterm-fork-{snap.id}-"))
        paths = TrialPaths(trial_dir)
        paths.mkdir()
        session = kwargs.pop("session_id", None) or f"{meta['environment_name']}__fork-{snap.id}"
        limits = meta.get("limits", {})
        kwargs.setdefault("memory_mb", limits.get("memory_mb"))
        kwargs.setdefault("storage_mb", limits.get("storage_mb"))
        kwargs.setdefault("network_policy", NetworkPolicy(network_mode=NetworkMode.NO_NETWORK))
        return cls(
            environment_dir=Path(meta["environment_dir"]),
            environment_name=meta["environment_name"],
            session_id=f"{session}-{index}",
            trial_paths=paths,
            task_env_config=cfg,
            _snapshot=snap,
            _owned_dirs=[trial_dir],
            **kwargs,
        )


def _is_verifier_command(command: str) -> bool:
    """True for the command Harbor's verifier runs: a script under ``/tests`` (``/tests/test.sh > ...``,
    quoted or not, in Harbor's ``(script) > stdout 2>&1``; ``harbor.verifier.verifier.Verifier.verify``)."""
    return _is_script_command(command, str(EnvironmentPaths.tests_dir))


def _is_script_command(command: str, folder: str) -> bool:
    """True when ``command`` runs a script under ``folder`` the way Harbor's verifier (``/tests``) and oracle
    agent (``/solution``) do (``harbor.utils.scripts.build_execution_command``); a ``chmod`` of it is not."""
    head = command.lstrip("( '\"")
    return head.startswith(folder + "/")


def _root_owned(info: tarfile.TarInfo) -> tarfile.TarInfo:
    info.uid = info.gid = 0
    info.uname = info.gname = "root"
    return info


def _extract_safely(tar_path: Path, target: Path) -> list[str]:
    """Unpack an archive made inside the sandbox (untrusted) with Harbor's transfer filter
    (tarfile's ``data`` filter: no absolute paths, no "..", no links leaving ``target``; device
    nodes skipped). Entries the filter refuses are skipped with a warning instead of failing the
    whole transfer (an agent could otherwise break the verifier's log download with one symlink).

    Returns the names of the skipped entries.
    """
    skipped: list[str] = []

    def filt(member: tarfile.TarInfo, dest: str) -> tarfile.TarInfo | None:
        try:
            return transfer_tar_filter(member, dest)
        except tarfile.FilterError as exc:
            skipped.append(member.name)
            logger.warning("download_dir: skipped %s (%s)", member.name, exc)
            return None

    with tarfile.open(tar_path) as tf:
        tf.extractall(path=target, filter=filt)
    return skipped


__all__ = ["LocalEnvironment", "LocalOptions", "Snapshot", "ExecTimeoutError", "SandboxError"]

