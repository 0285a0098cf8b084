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
from reterm.policies.endpoint import EndpointPolicy
from reterm.policies.sampling import SamplingParams
from reterm.policies.scripted import OraclePolicy
from reterm.policies.transformers_policy import TransformersPolicy
from reterm.tiny_qwen import TINY_QWEN_NAME

__all__ = ["FINISH_CONTEXT_LENGTH", "EndpointError", "Generation", "Policy", "SamplingParams", "load_policy",
           "POLICY_SPECS", "check_policy_spec", "resolve_hf_model", "is_local_path"]  # fmt: skip

POLICY_SPECS = {
    "smollm2": "the embedded default model SmolLM2-135M-Instruct (local, CPU is enough)",
    "hf:<path-or-hub-id>": "a transformers model (Qwen3.5 loads text-only): a local folder when it starts with "
    "/, . or ~ (hf:./ckpt), else a Hub id (hf:org/name); kwargs: adapter=PATH, dtype, device, ...",
    "<path>": "a local model folder written as a path (/..., ./..., ../..., ~/...): the same as hf:<path>",
    "openai:<model>": "an OpenAI-compatible server; kwargs: base_url=URL (default $OPENAI_BASE_URL or "
    "http://127.0.0.1:8000/v1), api_key_env=VAR (default OPENAI_API_KEY)",
    "oracle": "replays the task's solution/solve.sh; kwargs: tasks=TASK_DIR or a list of them",
}


# Files a transformers checkpoint (or PEFT adapter) needs from a Hub repository; weights in ``*.bin`` only
# when the repository has no safetensors.
_HUB_PATTERNS = ["*.json", "*.safetensors", "*.jinja", "*.model", "*.txt", "*.tiktoken"]


def is_local_path(ref: str) -> bool:
    """True when ``ref`` is written as a local path: absolute, or starting with ``.`` or ``~``
    (``./ckpt``, ``../runs/x``, ``~/models/y``). Anything else is a Hub id or a kit model name."""
    return ref.startswith(("/", ".", "~"))


def resolve_hf_model(ref: str) -> str:
    """The local folder (or kit model name) that ``hf:<ref>`` loads, decided by how ``ref`` is written.

    - the kit's model names (``smollm2``, ``tiny-qwen3.5``): returned unchanged;
    - a local path (:func:`is_local_path`): that folder, which must exist;
    - anything else: a Hub id (``org/name``), downloaded (or found in the Hub cache) with
      ``huggingface_hub.snapshot_download`` (config, tokenizer, chat template and safetensors files),
      never a folder of the working directory with the same name.

    Raises:
        ValueError: naming the reference, what it was read as, what was tried and why it failed (a
            missing folder; an invalid Hub id; a Hub repository that cannot be fetched, with the folder
            of the same name pointed out when one exists).
    """

    ref = ref.strip()
    if not ref:
        raise ValueError("policy spec 'hf:' needs a model: hf:<local-path-or-hub-id>")
    if ref in ("smollm2", TINY_QWEN_NAME):
        return ref
    if is_local_path(ref):
        path = Path(ref).expanduser().absolute()
        if not path.is_dir():
            what = "a file, not a folder" if path.exists() else "nothing there"
            raise ValueError(f"hf:{ref}: read as a local path (it starts with '/', '.' or '~'); no such model "
                             f"folder {path} ({what})")  # fmt: skip
        return str(path)
    hint = f" A local folder is written as a path: hf:./{ref}" + (
        f" (./{ref} exists here)." if Path(ref).exists() else "."
    )
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(ref)
    except HFValidationError as exc:
        raise ValueError(f"hf:{ref}: read as a Hub id (it does not start with '/', '.' or '~'), but it is not a "
                         f"valid one ({exc}).{hint}") from None  # fmt: skip
    try:
        folder = Path(snapshot_download(ref, allow_patterns=_HUB_PATTERNS))
        if not any(folder.glob("*.safetensors")) and not (folder / "adapter_config.json").is_file():
            folder = Path(snapshot_download(ref, allow_patterns=_HUB_PATTERNS + ["*.bin"]))
    except Exception as exc:  # RepositoryNotFoundError, LocalEntryNotFoundError (offline), HTTP errors, ...
        raise ValueError(f"hf:{ref}: read as a Hub id (it does not start with '/', '.' or '~'); fetching it from "
                         f"{constants.ENDPOINT} (or the Hub cache {constants.HF_HUB_CACHE}) failed: "
                         f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}.{hint}") from None  # fmt: skip
    return str(folder)


def check_policy_spec(spec: str) -> str:
    """The stripped ``spec`` if it has one of the :data:`POLICY_SPECS` forms, without building anything
    (for config validation: a typo fails at load time, not in every trial).

    Raises:
        ValueError: an unknown or incomplete spec (the message lists the known forms).
    """
    spec = (spec or "").strip()
    if spec in ("smollm2", "oracle") or (spec and is_local_path(spec)):
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
        ``"hf:<path-or-id>"``: :class:`TransformersPolicy` on :func:`resolve_hf_model` of the rest: a local
        folder when it starts with ``/``, ``.`` or ``~``, else a Hub id (``adapter=PATH`` adds a PEFT
        adapter; ``hf:smollm2`` is the embedded model too). A plain path spec (``./ckpt``) is ``hf:./ckpt``.
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
        ValueError: an unknown or incomplete spec, a model that cannot be found (see
            :func:`resolve_hf_model`), or a missing required keyword (named in the message).
    """
    spec = (spec or "").strip()
    if spec and is_local_path(spec):
        spec = f"hf:{spec}"
    if spec == "smollm2" or spec.startswith("hf:"):
        ref = spec[3:].strip() if spec.startswith("hf:") else "smollm2"
        model = resolve_hf_model(ref)
        if model != ref:
            kwargs.setdefault("name", f"hf:{ref}")
        return TransformersPolicy(model, **kwargs)
    if spec.startswith("openai:"):
        model = spec[len("openai:") :]
        if not model:
            raise ValueError("policy spec 'openai:' needs the served model name: openai:<model>")
        return EndpointPolicy(model, **kwargs)
    if spec == "oracle":
        tasks = kwargs.pop("tasks", None)
        task = kwargs.pop("task", None)
        if tasks is None and task is None:
            raise ValueError("policy 'oracle' needs the task(s) whose solution it replays: tasks=TASK_DIR")
        return OraclePolicy(tasks if tasks is not None else task, **kwargs)
    known = "\n".join(f"  {k}: {v}" for k, v in POLICY_SPECS.items())
    raise ValueError(f"unknown policy spec {spec!r}; known specs:\n{known}")
