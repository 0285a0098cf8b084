"""The GPU kernels the 9B recipe runs fast on: what is pinned, what is installed, what a model actually calls.

Qwen3.5 has 24 Gated DeltaNet (linear attention) layers out of 32. transformers 5.24 runs them on
``flash-linear-attention`` (package ``fla``) and ``causal-conv1d`` when those import, and otherwise on its own
reference PyTorch code with a one-time warning. Measured on one H200 (docs/REPRODUCING.md): the fallback is 4-9x
slower and needs 18 instead of 10 GB for the recomputed layer at 32K tokens. So the 9B path pins the kernels in
``requirements-gpu.txt`` and checks them:

- :func:`read_pins`: the ``name==version`` lines of a requirements file;
- :func:`check_gpu_packages`: each pin installed at its version, Triton new enough for fla's Hopper backward, and an
  installed vLLM whose own requirements (torch, transformers) the environment meets;
- :func:`kernels_in_use`: which implementation transformers' Qwen3.5 module resolved for each kernel function
  (the real dispatch, read from the module, not guessed from what is installed).

Written for this kit (train/check_recipe.py and train/gpu_smoke.py use it).
"""

from __future__ import annotations

import importlib.metadata
import inspect
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

#: fla 0.6.0's gated-delta backward refuses Hopper (sm_90) with an older Triton (wrong results, fla issue #640).
FLA_HOPPER_MIN_TRITON = "3.7.1"

#: transformers' Qwen3.5 kernel functions and the package each one comes from when installed.
QWEN35_KERNEL_FUNCTIONS = {
    "torch_chunk_gated_delta_rule": "flash-linear-attention",  # training and prefill
    "torch_recurrent_gated_delta_rule": "flash-linear-attention",  # one token at a time (generation)
    "causal_conv1d_fn": "causal-conv1d",
    "causal_conv1d_update": "causal-conv1d",
}

_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;#]+)\s*(?:#.*)?$")


@dataclass
class PackageCheck:
    """One GPU package as found in this environment.

    Attributes:
        name: the distribution name (``flash-linear-attention``).
        wanted: the pinned version, or a requirement such as ``>=3.7.1``.
        installed: the installed version, ``None`` when not installed.
        problem: ``None`` when it is as wanted, else ``"missing"`` or ``"mismatch"``.
        detail: one line for a report (what is wrong and what to run).
    """

    name: str
    wanted: str
    installed: str | None
    problem: str | None
    detail: str

    def status(self, on_gpu: bool) -> str:
        """The check's status: ``OK``; a problem is ``FAIL`` on a GPU machine and ``WARN`` elsewhere."""
        if self.problem is None:
            return "OK"
        return "FAIL" if on_gpu else "WARN"


def read_pins(path: Path) -> dict[str, str]:
    """The ``name==version`` pins of a requirements file (comments and blank lines skipped).

    Raises:
        FileNotFoundError: no such file.
        ValueError: a line that is not ``name==version`` (naming the file and line): the check reads exact pins only.
    """
    pins: dict[str, str] = {}
    for i, line in enumerate(Path(path).read_text().splitlines(), 1):
        text = line.strip()
        if not text or text.startswith("#"):
            continue
        m = _PIN.match(text)
        if not m:
            raise ValueError(f"{path}:{i}: {text!r} is not an exact pin (name==version)")
        pins[m.group(1).lower()] = m.group(2)
    return pins


def installed_version(name: str) -> str | None:
    """The installed version of a distribution, ``None`` when it is not installed."""
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def _ver(text: str):
    from packaging.version import Version

    return Version(text.split("+")[0])


def vllm_requirement_problems(version_of: Callable[[str], str | None] = installed_version,
                              requires: Callable[[str], list[str] | None] = importlib.metadata.requires) -> list[str]:  # fmt: skip
    """Requirements of the installed vLLM on torch and transformers that this environment does not meet.

    Returns:
        One string per unmet requirement (``"torch==2.14.0 (installed 2.14.1)"``); empty when vLLM is not
        installed or all are met. vLLM's colocated mode (GRPO) imports it into the training process, so the
        training environment's torch and transformers must be the ones it was built for.
    """
    from packaging.requirements import Requirement

    if version_of("vllm") is None:
        return []
    out = []
    for text in requires("vllm") or []:
        req = Requirement(text)
        if req.name.lower() not in ("torch", "transformers") or (req.marker and not req.marker.evaluate()):
            continue
        have = version_of(req.name)
        if have is None or not req.specifier.contains(have.split("+")[0], prereleases=True):
            out.append(f"{req.name}{req.specifier} (installed {have or 'none'})")
    return out


def check_gpu_packages(pins: dict[str, str], *, version_of: Callable[[str], str | None] = installed_version,
                       hopper: bool = False,
                       vllm_problems: Callable[[], list[str]] | None = None) -> list[PackageCheck]:  # fmt: skip
    """Check the pinned GPU packages, Triton and an installed vLLM against this environment.

    Args:
        pins: ``{name: version}`` (:func:`read_pins` of requirements-gpu.txt).
        version_of: how an installed version is read (a test passes a fake environment).
        hopper: the GPU is Hopper (compute capability 9.x): fla's backward then needs Triton >= 3.7.1.
        vllm_problems: the unmet requirements of an installed vLLM (default :func:`vllm_requirement_problems`).

    Returns:
        One :class:`PackageCheck` per pin, then ``triton`` (the version torch brought, and the Hopper rule) and
        ``vllm`` (installed or not; its requirements). Nothing is imported: a check never starts CUDA.
    """
    out = []
    for name, wanted in pins.items():
        have = version_of(name)
        if have is None:
            out.append(PackageCheck(name, wanted, None, "missing",
                                    "not installed (bash scripts/setup_gpu.sh)"))  # fmt: skip
        elif have.split("+")[0] != wanted:
            out.append(PackageCheck(name, wanted, have, "mismatch",
                                    f"{have} installed, the GPU set pins {wanted}"))  # fmt: skip
        else:
            out.append(PackageCheck(name, wanted, have, None, have))
    triton = version_of("triton")
    if triton is None:
        out.append(PackageCheck("triton", f">={FLA_HOPPER_MIN_TRITON}", None, "missing",
                                "not installed (it comes with torch's Linux wheels)"))  # fmt: skip
    elif hopper and version_of("flash-linear-attention") and _ver(triton) < _ver(FLA_HOPPER_MIN_TRITON):
        out.append(PackageCheck("triton", f">={FLA_HOPPER_MIN_TRITON}", triton, "mismatch",
                                f"{triton}: fla refuses its gated-delta backward on Hopper below {FLA_HOPPER_MIN_TRITON} "
                                "(fla issue #640); use torch 2.14.1's Triton"))  # fmt: skip
    else:
        out.append(PackageCheck("triton", f">={FLA_HOPPER_MIN_TRITON}", triton, None,
                                f"{triton} (torch {version_of('torch') or '?'}'s)"))  # fmt: skip
    vllm = version_of("vllm")
    unmet = (vllm_problems or (lambda: vllm_requirement_problems(version_of)))() if vllm else []
    if vllm is None:
        out.append(PackageCheck("vllm", "any", None, "missing",
                                "not installed (GRPO's generation, the data and eval servers: bash scripts/setup_gpu.sh)"))  # fmt: skip
    elif unmet:
        out.append(PackageCheck("vllm", "any", vllm, "mismatch",
                                f"{vllm} requires " + ", ".join(unmet)))  # fmt: skip
    else:
        out.append(PackageCheck("vllm", "any", vllm, None, vllm))
    return out


def cuda_summary() -> tuple[bool, bool, str]:
    """``(on_gpu, hopper, description)`` of this machine, read from torch (no kernel is compiled).

    ``on_gpu`` is whether torch sees a CUDA device; ``hopper`` whether device 0 is compute capability 9.x.
    """
    import torch

    if not torch.cuda.is_available():
        return False, False, "no CUDA device (CPU)"
    major, minor = torch.cuda.get_device_capability(0)
    name = torch.cuda.get_device_name(0)
    return True, major == 9, f"{torch.cuda.device_count()} x {name} (sm_{major}{minor}), CUDA {torch.version.cuda}"


def kernels_in_use() -> dict[str, str]:
    """Which implementation each Qwen3.5 kernel function of transformers dispatches to in this process.

    Returns:
        ``{function: "fla.ops.gated_delta_rule.chunk.chunk_gated_delta_rule"}`` for an installed kernel, or
        ``{function: "torch fallback (flash-linear-attention not installed)"}``; read from the closure of the
        function transformers' ``use_kernel_func_from_hub_with_fallback`` built when the module was imported.

    Raises:
        RuntimeError: transformers' Qwen3.5 module no longer has these functions or their closure changed shape
            (the report would otherwise be a guess).
    """
    from transformers.models.qwen3_5 import modeling_qwen3_5 as mod

    out = {}
    for fn_name, package in QWEN35_KERNEL_FUNCTIONS.items():
        fn = getattr(mod, fn_name, None)
        if fn is None:
            raise RuntimeError(f"transformers.models.qwen3_5.modeling_qwen3_5 has no {fn_name} (transformers changed)")
        impl = inspect.getclosurevars(fn).nonlocals.get("implementation")
        if impl is None:
            raise RuntimeError(f"cannot read which implementation {fn_name} dispatches to (transformers changed)")
        module = getattr(impl, "__module__", "") or ""
        if module == mod.__name__:
            out[fn_name] = f"torch fallback ({package} not installed)"
        else:
            out[fn_name] = f"{module}.{getattr(impl, '__name__', '?')}"
    return out
