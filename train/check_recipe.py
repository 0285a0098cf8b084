"""``bash train/run_all.sh --recipe NAME --check``: validate a recipe's whole chain on a machine without GPUs.

    python train/check_recipe.py --recipe qwen3.5-9b [--run-dir runs/qwen3.5-9b/check] [--skip-steps] [--plan]

It checks **the commands run_all runs**, not its own: the stage commands come from ``bash train/run_all.sh
--recipe NAME --run-dir RUN --dry-run`` (:func:`composed_commands`, with the environment run_all reads:
``ACCELERATE_CONFIG``, ``RETERM_POLICY_URL``, ``RETERM_TEACHER_URL``), and :func:`check_plan` turns each into
its check with only the model swapped for the tiny Qwen3.5 (the training scripts' ``--check``) and the
devices for the CPU (one plain ``python`` process instead of ``accelerate launch``); ``--plan`` prints that
plan as JSON and exits. What it checks, in order (each line says OK, WARN, MISSING or FAIL):

1. **Recipes parse**: every YAML of ``train/recipes/NAME/`` through the training script's own ``TrlParser``
   (``train/sft.py`` for ``sft*.yaml``, ``train/grpo.py`` for ``grpo*.yaml``: unknown keys fail), read with
   the CPU-safe values a GPU recipe needs here (``bf16``/``fp16``/``tf32`` off, ``use_cpu``, no vLLM).
2. **Pipeline and eval configs load**, as the data and eval stages' commands name them (the data stage's
   ``--set`` overrides applied): :func:`reterm.data.config.load_config`, its endpoint policies constructed
   (no request is sent); the eval config turned into Harbor ``JobConfig``s, one per model; a registry
   dataset that cannot be reached is a WARN (offline machines use a local copy: ``-p DIR``). The vLLM
   servers a stage starts (``train/stages.py with-vllm``) are laid out for 8 GPUs and printed.
3. **Trainers build and take one step** on the tiny Qwen3.5: each training stage's command line as run_all
   composes it, launcher removed, ``--check`` appended (outputs under ``--run-dir``); ``--skip-steps``
   leaves this out.
4. **Launch commands compose**: for every ``train/accelerate_configs/*.yaml``, the training commands run_all
   composes with ``ACCELERATE_CONFIG`` set to it are parsed by accelerate's own launch parser and config
   merge (accelerate's ``_validate_launch_command``; accelerate has no public dry run), and the settings the
   Trainer would refuse at construction are found here (:func:`check_launch`: FSDP's activation
   checkpointing together with the trainer's). DeepSpeed itself is needed only on the GPU machine.
5. **GPU set, machine and credentials**: every pin of the GPU set (``requirements-gpu.txt``,
   ``requirements-gpu-build.txt``, ``requirements-gpu-nodeps.txt``: torch, transformers, vLLM, TRL, the Qwen3.5
   kernels, DeepSpeed, harbor) installed at its version, Triton new enough for fla's Hopper backward, an
   installed vLLM whose torch/transformers requirements this environment meets, and which implementation
   transformers' Qwen3.5 kernel functions dispatch to (:func:`gpu_package_checks`): a missing or mismatched one is
   a FAIL on a machine with a CUDA GPU and a WARN on one without. Then (reported, never a failure): GPUs, ``vllm``
   in this environment's ``bin/``, ``HF_TOKEN`` (or a ``hf auth login`` token),
   ``HUB_ORG``, ``DAYTONA_API_KEY``, the policy and teacher endpoints (``RETERM_POLICY_URL``,
   ``RETERM_TEACHER_URL``, else the configs' URLs, probed with ``GET /models``). Secrets are never printed.

Exit status: 1 when a FAIL was found (a config that does not parse, a trainer that does not build or step,
a launch command that does not compose, a GRPO micro-batch above 80 GB, a GPU kernel missing on a GPU machine),
else 0; WARN and MISSING (credentials, GPUs, network, kernels on a CPU) do not fail.
Written for this kit: it strings together the checks each part already offers.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shlex
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "train"))

TRAINING_STAGES = ("sft", "grpo", "grpo-standard")
CPU_SAFE = ["--bf16", "False", "--fp16", "False", "--tf32", "False", "--use_cpu", "True"]


@dataclass
class Result:
    """One checked item: ``status`` is OK, WARN, MISSING or FAIL."""

    section: str
    item: str
    status: str
    detail: str = ""


class Checker:
    """Collects :class:`Result`s and prints each as it comes."""

    def __init__(self) -> None:
        self.results: list[Result] = []

    def add(self, section: str, item: str, status: str, detail: str = "") -> None:
        self.results.append(Result(section, item, status, detail))
        mark = {"OK": "ok  ", "WARN": "warn", "MISSING": "miss", "FAIL": "FAIL"}[status]
        print(f"  [{mark}] {item}" + (f": {detail}" if detail else ""), flush=True)

    def run(self, section: str, item: str, fn: Callable[[], str | tuple[str, str]]) -> None:
        """Call ``fn``; its string is an OK detail, a ``(status, detail)`` pair sets the status; an
        exception is a FAIL with its message."""
        try:
            out = fn()
        except Exception as exc:  # noqa: BLE001 - every failure of a check is reported, not raised
            msg = str(exc).strip().splitlines()
            self.add(section, item, "FAIL", f"{type(exc).__name__}: {msg[0] if msg else ''}"
                     + (f" (... {len(msg) - 1} more lines)" if len(msg) > 1 else ""))  # fmt: skip
            return
        status, detail = out if isinstance(out, tuple) else ("OK", out)
        self.add(section, item, status, detail)

    @property
    def failed(self) -> list[Result]:
        return [r for r in self.results if r.status == "FAIL"]


def _load_script(path: Path) -> Any:
    """Import a training script (``train/sft.py``) as a module without running it."""
    spec = importlib.util.spec_from_file_location(f"_reterm_{path.stem}", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the script is executed
    spec.loader.exec_module(module)
    return module


# ------------------------------------------------------------------------------ 0. run_all's commands
def parse_dry_run(text: str) -> dict[str, list[str]]:
    """The stage commands of ``run_all.sh --dry-run`` output: ``{stage: argv}`` in stage order.

    The format (train/run_all.sh ``stage``): a ``[NAME]`` line, then the command indented by two spaces and
    shell-quoted (``printf %q``), then optional notes in parentheses.
    """
    out: dict[str, list[str]] = {}
    name = None
    for line in text.splitlines():
        if line.startswith("[") and line.rstrip().endswith("]"):
            name = line.strip()[1:-1]
        elif name is not None and line.startswith("  ") and not line.strip().startswith("("):
            out[name] = shlex.split(line)
            name = None
    return out


def composed_commands(recipe: str, run_dir: Path, env: dict[str, str] | None = None,
                      only: list[str] | None = None) -> dict[str, list[str]]:
    """The stage commands ``bash train/run_all.sh --recipe RECIPE --run-dir RUN_DIR --dry-run`` composes.

    Args:
        env: variables set on top of this process's environment (e.g. ``{"ACCELERATE_CONFIG": "fsdp2"}``).
        only: stages to compose (``--only``), default all.

    Raises:
        RuntimeError: run_all.sh exited non-zero (its stderr is in the message).
    """
    cmd = ["bash", "train/run_all.sh", "--recipe", recipe, "--run-dir", str(run_dir), "--dry-run"]
    for stage in only or []:
        cmd += ["--only", stage]
    r = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=120, env={**os.environ, **(env or {})})
    if r.returncode != 0:
        raise RuntimeError(f"`{' '.join(cmd)}` exited {r.returncode}: {r.stderr.strip()[-500:]}")
    return parse_dry_run(r.stdout)


def split_launcher(argv: list[str]) -> tuple[list[str], list[str]]:
    """``[accelerate, launch, ..., train/sft.py, ARGS...]`` -> ``(launcher, [train/sft.py, ARGS...])``.

    Raises:
        ValueError: no ``train/sft.py`` / ``train/grpo.py`` in the command.
    """
    for i, arg in enumerate(argv):
        if arg in ("train/sft.py", "train/grpo.py"):
            return argv[:i], argv[i:]
    raise ValueError(f"not a training command (no train/sft.py or train/grpo.py): {' '.join(argv)}")


def split_wrapper(argv: list[str]) -> tuple[list[str], list[str]]:
    """A stage command wrapped in ``train/stages.py with-vllm ... --`` -> ``(wrapper, command)``; an
    unwrapped command gives ``([], argv)``."""
    if "with-vllm" in argv and "--" in argv:
        i = argv.index("--")
        return argv[:i], argv[i + 1 :]
    return [], argv


def check_plan(commands: dict[str, list[str]]) -> dict[str, dict[str, Any]]:
    """What the check runs for each of run_all's stage commands.

    A training stage (``sft``, ``grpo``, ``grpo-standard``) becomes ``{"run": [python, train/X.py, <the
    stage's arguments unchanged>, "--check"], "launcher": [...]}``: the same recipe, flags and output folder,
    the model swapped for the tiny Qwen3.5 by the script's ``--check`` (which also appends ``-check`` to
    ``output_dir``), one CPU process for the launcher (checked separately, section 4). A stage wrapped in
    ``with-vllm`` gets ``"servers"`` (its wrapper); ``data`` gets ``"pipeline"`` (config path and ``--set``
    overrides), ``eval`` gets ``"eval"`` (config path). Other stages are listed with ``"not_run"``.
    """
    plan: dict[str, dict[str, Any]] = {}
    for stage, argv in commands.items():
        wrapper, inner = split_wrapper(argv)
        entry: dict[str, Any] = {"command": argv}
        if wrapper:
            entry["servers"] = wrapper
        if stage in TRAINING_STAGES:
            launcher, script = split_launcher(inner)
            entry["launcher"] = launcher
            entry["run"] = [sys.executable, *script, "--check"]
        elif "pipeline.build" in inner:
            sets = [inner[i + 1] for i, a in enumerate(inner) if a == "--set"]
            entry["pipeline"] = {"config": inner[inner.index("--config") + 1], "set": sets}
        elif "eval.run" in inner:
            entry["eval"] = {"config": inner[inner.index("--config") + 1]}
        else:
            entry["not_run"] = "not a config or training stage (setup ran already; cards and summary need outputs)"
        plan[stage] = entry
    return plan


def check_servers(wrapper: list[str]) -> str | tuple[str, str]:
    """The vLLM servers a ``with-vllm`` wrapper starts, laid out for 8 GPUs (train/stages.py's layout)."""
    import stages  # train/stages.py

    a = stages.make_parser().parse_args(wrapper[wrapper.index("with-vllm"):])
    cmds = stages.vllm_commands([stages.parse_serve(x) for x in a.serve], 8, a.vllm_arg, binary="vllm")
    return "; ".join(f"CUDA_VISIBLE_DEVICES={dev} " + " ".join([Path(c[0]).name, *c[1:11]]) for c, dev in cmds)


# ------------------------------------------------------------------------------------------ 1. recipes
def check_recipe_file(path: Path) -> str:
    """Parse one recipe with its script's parser (CPU-safe values); returns a one-line description."""
    script = REPO / "train" / ("sft.py" if path.name.startswith("sft") else "grpo.py")
    module = _load_script(script)
    extra = list(CPU_SAFE) + (["--use_vllm", "False"] if script.name == "grpo.py" else [])
    script_args, args, model_args = module.make_parser().parse_args_and_config(["--config", str(path), *extra])
    bits = [f"model {model_args.model_name_or_path}", f"data {script_args.dataset_name}"]
    if script.name == "grpo.py":
        bits += [f"mode {args.mode}", f"G={args.num_generations}", f"env {args.environment}",
                 f"steps {args.max_steps}"]  # fmt: skip
    else:
        bits += [f"epochs {args.num_train_epochs}", f"max_length {args.max_length}"]
    bits.append("LoRA" if model_args.use_peft else "full fine-tuning")
    return f"{script.relative_to(REPO)} parser: " + ", ".join(bits)


# ------------------------------------------------------------------------------- 2. pipeline, eval
def check_pipeline(path: Path, sets: list[str] | None = None) -> str:
    """Load the pipeline config with the data stage's ``--set`` overrides and construct its endpoint
    policies (nothing is sent)."""
    from reterm.agent.environments import environment_kind
    from reterm.data.build import _parse_set
    from reterm.data.config import load_config
    from reterm.policies import load_policy

    cfg = load_config(path, _parse_set(sets or []))
    built = []
    for role, spec, kwargs in (("rollout", cfg.rollout.policy, cfg.rollout.policy_kwargs),
                               ("recovery", cfg.recovery.policy, cfg.recovery.policy_kwargs),
                               ("judge", cfg.failures.judge, cfg.failures.judge_kwargs)):  # fmt: skip
        if spec and spec.startswith("openai:"):
            load_policy(spec, **kwargs)
            built.append(f"{role} {spec} @ {kwargs.get('base_url')}")
    environment_kind(cfg.rollout.environment.type)  # raises ValueError naming an unknown type
    return (
        f"{cfg.name}: tasks {cfg.tasks.path}:{cfg.tasks.split}, k={cfg.rollout.attempts}, N={cfg.recovery.attempts}, "
        f"environment {cfg.rollout.environment.type}"
        + (f"; endpoint policies built: {'; '.join(built)}" if built else "")
    )


def check_eval(path: Path) -> str:
    """Load an eval config and build the Harbor ``JobConfig`` of each model."""
    from reterm.eval.run import job_config, load_config

    cfg = load_config(path)
    for m in cfg.models:
        job_config(cfg, m)
    return (
        f"{cfg.name}: dataset {cfg.dataset.label}, env {cfg.environment.type}, {cfg.trials} trials, "
        f"{len(cfg.models)} models -> {len(cfg.models)} Harbor JobConfigs built"
    )


def check_eval_dataset(path: Path) -> str | tuple[str, str]:
    from reterm.eval.run import DatasetUnavailableError, check_dataset_reachable, load_config

    cfg = load_config(path)
    try:
        check_dataset_reachable(cfg.dataset, timeout_s=3.0)
    except DatasetUnavailableError:
        return "WARN", (
            f"{cfg.dataset.label} cannot be reached from this machine (offline); on the GPU machine it "
            "downloads, or use a local copy with `-p DIR`"
        )
    return f"{cfg.dataset.label} reachable" if cfg.dataset.name else f"local folder {cfg.dataset.path}"


# ------------------------------------------------------------------------------------ 3. one step
def check_step(cmd: list[str], out_dir: Path, log_dir: Path) -> str:
    """Run one training command of the plan (``python train/X.py ... --check``: tiny Qwen3.5, one step) in
    a subprocess; ``out_dir`` is the command's ``--output_dir`` (the script writes ``OUT_DIR-check``)."""
    log_dir.mkdir(parents=True, exist_ok=True)
    log = log_dir / f"{out_dir.name}.log"
    t0 = time.monotonic()
    with open(log, "w") as fh:
        code = subprocess.call(
            cmd, cwd=REPO, stdout=fh, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"}
        )
    wall = time.monotonic() - t0
    if code != 0:
        tail = log.read_text(errors="replace").strip().splitlines()[-3:]
        raise RuntimeError(f"`{' '.join(cmd[1:])}` exited {code} after {wall:.0f} s; log {log}: " + " | ".join(tail))
    check_out = Path(f"{out_dir}-check")
    summary = check_out / "training_summary.json"
    if not summary.is_file():
        raise RuntimeError(f"{summary} was not written (log {log})")
    s = json.loads(summary.read_text())
    if s.get("steps") != 1:
        raise RuntimeError(f"{summary}: {s.get('steps')} steps, expected 1")
    return f"tiny Qwen3.5, 1 step in {wall:.0f} s ({check_out})"


def _output_dir(argv: list[str]) -> Path:
    """The last ``--output_dir`` of a training command (HfArgumentParser keeps the last one)."""
    idx = [i for i, a in enumerate(argv) if a == "--output_dir"]
    if not idx:
        raise ValueError(f"no --output_dir in {' '.join(argv)}")
    out = Path(argv[idx[-1] + 1])
    return out if out.is_absolute() else REPO / out


# --------------------------------------------------------------------------------- 4. accelerate
def training_args_of(script_argv: list[str]) -> Any:
    """The training arguments a training command (``[train/X.py, ARGS...]``) gives its trainer, read with the
    script's own parser (CPU-safe values only for the fields a CPU cannot validate)."""
    module = _load_script(REPO / script_argv[0])
    extra = list(CPU_SAFE) + (["--use_vllm", "False"] if script_argv[0].endswith("grpo.py") else [])
    _, args, _ = module.make_parser().parse_args_and_config([*script_argv[1:], *extra])
    return args


def check_launch(launcher: list[str], script_argv: list[str]) -> str | tuple[str, str]:
    """Parse ``LAUNCHER train/X.py ARGS`` with accelerate's launch parser and merge its config file (no
    process starts), then look for settings the Trainer refuses at construction.

    Raises:
        ValueError: FSDP's activation checkpointing (``fsdp_activation_checkpointing`` of the accelerate
            config) together with the trainer's ``gradient_checkpointing`` (the name transformers 5.20 and 5.24
            both read; 5.24's ``activation_checkpointing`` mirrors it): transformers' Trainer raises
            then (``trainer.py``, ``create_accelerator_and_postprocess``: "can't both be set to True"); on
            8 GPUs that is a crash at start-up, here it is found from the same two settings.
    """
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser

    i = launcher.index("launch")
    args = launch_command_parser().parse_args([*launcher[i + 1 :], *script_argv])
    args, defaults, _ = _validate_launch_command(args)
    kind = (
        "DeepSpeed" if args.use_deepspeed else "FSDP" if args.use_fsdp else "multi-GPU" if args.multi_gpu else "single"
    )
    detail = (
        f"{kind}, {args.num_processes} processes x {args.num_machines} machine(s), mixed precision "
        f"{args.mixed_precision}"
    )
    train_args = training_args_of(script_argv)
    if args.use_fsdp:
        from accelerate.utils.launch import prepare_multi_gpu_env

        env = prepare_multi_gpu_env(args)
        fsdp_ac = env.get("FSDP_ACTIVATION_CHECKPOINTING", "false").lower() == "true"
        detail += f", FSDP v{env.get('FSDP_VERSION', '1')} {env.get('FSDP_AUTO_WRAP_POLICY', '')}"
        if fsdp_ac and train_args.gradient_checkpointing:
            raise ValueError(
                "the accelerate config turns on FSDP's activation checkpointing and the command leaves the "
                "trainer's `gradient_checkpointing` on: transformers' Trainer refuses both at construction "
                "(pass --gradient_checkpointing false, as run_all.sh does for such a config)"
            )
        detail += ", activation checkpointing by " + ("FSDP" if fsdp_ac else "the trainer" if
                                                      train_args.gradient_checkpointing else "nobody")  # fmt: skip
    if args.use_deepspeed:
        stage = (defaults.deepspeed_config or {}).get("zero_stage")
        detail += f", ZeRO stage {stage}"
        if importlib.util.find_spec("deepspeed") is None:
            return "WARN", detail + "; deepspeed is not installed here (requirements-gpu.txt, on the GPU machine)"
    return detail


# Qwen3.5-9B's text model (transformers 5.24's Qwen3_5TextConfig defaults; compare with the checkpoint's config.json):
# parameters, hidden size, layers, MLP width, vocabulary
QWEN35_9B = {"params": 8.95e9, "hidden": 4096, "layers": 32, "intermediate": 12288, "vocab": 248320}
GPU_GB = 80.0
#: Per-sequence terms measured on one H200 (2026-12-04; Qwen3.5-9B-shaped model with random weights, bf16, batch 1,
#: activation checkpointing, loss through TRL 1.16's chunked LM head; issue 32, docs/REPRODUCING.md), at
#: ``MEASURED_SEQ`` tokens, in GB (1e9 bytes). "fla" = with flash-linear-attention 0.6.0 + causal-conv1d, "torch" =
#: transformers' reference PyTorch code for the Gated DeltaNet layers.
MEASURED_SEQ = 32768
MEASURED_9B_GB = {
    "checkpointed activations": 10.2,              # one saved input a layer for 32K tokens (the estimate was 8.6)
    "recomputed layer": {"fla": 10.0, "torch": 18.0},  # a layer's forward recomputed plus its backward, at its peak
    "lm head gradient": 4.1 + 2.0,                 # TRL's chunked head: an fp32 gradient of the 248,320 x 4,096
}                                                  # head and its bf16 copy, at any length
#: Per-GPU memory no measurement on one GPU shows: the CUDA context and NCCL buffers (~1.5 GB) and ZeRO-3's live
#: gathered parameters and reduce bucket (accelerate's defaults: up to 1e9 live parameters = 2 GB in bf16, a 5e8
#: bucket = 1 GB). A margin, not a measurement.
ZERO3_MARGIN_GB = 4.5


def grpo_gpu_memory_gb(args: Any, use_vllm: bool, n_gpus: int = 8, model: dict[str, float] | None = None,
                       checkpointing: bool | None = None, kernels: str = "fla") -> dict[str, float]:
    """Per-GPU memory (GB, 1e9 bytes) of one GRPO micro-batch at the recipe's longest sequence, ZeRO-3 over
    ``n_gpus`` with a colocated vLLM engine, from the terms measured on one H200 (:data:`MEASURED_9B_GB`):

    - ZeRO-3 states (arithmetic): bf16 weights + bf16 gradients + fp32 master weights + two fp32 Adam moments =
      16 bytes a parameter, sharded over the GPUs;
    - vLLM (a budget): ``vllm_gpu_memory_utilization`` x 80 GB (its own bf16 copy of the weights and the KV cache);
    - checkpointed activations (measured): 10.2 GB a 32K sequence, scaled linearly with the tokens of the
      micro-batch; without activation checkpointing, the usual ~34 values a token a hidden unit a layer (arithmetic);
    - the recomputed layer's forward and backward at its peak (measured): 10 GB a 32K sequence with
      flash-linear-attention, 18 GB on transformers' PyTorch fallback (``kernels="torch"``), scaled linearly (the
      fallback grows faster than linearly: below 32K this overestimates it);
    - the LM head's gradient (measured): TRL 1.16 scores through ``add_fused_lm_head``, which never materialises
      the logits but allocates the head's full fp32 gradient (4.1 GB) and a bf16 copy (2.0 GB) in backward;
    - a margin for the CUDA context, NCCL and ZeRO-3's gathered parameters and buckets (:data:`ZERO3_MARGIN_GB`).

    The three activation terms are added although they do not all peak at the same moment (their sum, 26 GB at 32K
    with fla, is above the 20.3 GB of "peak - weights - gradients" measured on one GPU): a bound, not a forecast.
    Every term is per sequence times ``per_device_train_batch_size``, at ``max_state_prompt_tokens +
    max_completion_length`` tokens (capped by ``vllm_max_model_length``). ``checkpointing`` (default: the
    trainer's ``gradient_checkpointing``) is true too when FSDP checkpoints the activations instead.

    Raises:
        ValueError: ``kernels`` is neither ``"fla"`` nor ``"torch"``.
    """
    if kernels not in ("fla", "torch"):
        raise ValueError(f"kernels must be 'fla' or 'torch', not {kernels!r}")
    m = model or QWEN35_9B
    b = args.per_device_train_batch_size
    seq = (args.max_state_prompt_tokens or 0) + args.max_completion_length
    if getattr(args, "vllm_max_model_length", None):
        seq = min(seq, args.vllm_max_model_length)
    if checkpointing is None:
        checkpointing = bool(args.gradient_checkpointing)
    scale = b * seq / MEASURED_SEQ
    activations = (MEASURED_9B_GB["checkpointed activations"] * scale if checkpointing
                   else b * seq * m["layers"] * 34 * m["hidden"] / 1e9)  # fmt: skip
    out = {
        "zero3 states": 16 * m["params"] / n_gpus / 1e9,
        "vllm": (args.vllm_gpu_memory_utilization if use_vllm else 0.0) * GPU_GB,
        "activations": activations,
        "recomputed layer": MEASURED_9B_GB["recomputed layer"][kernels] * scale,
        "lm head gradient": MEASURED_9B_GB["lm head gradient"],
        "margin": ZERO3_MARGIN_GB,
    }
    out["total"] = sum(out.values())
    return out


def check_grpo_memory(script_argv: list[str], launcher: list[str] | None = None) -> str:
    """:func:`grpo_gpu_memory_gb` of a GRPO command's arguments (activation checkpointing by the trainer or by the
    launcher's FSDP config), with the recipe's kernels (requirements-gpu.txt: flash-linear-attention); the figure
    on transformers' PyTorch fallback is reported beside it.

    Raises:
        ValueError: above 80 GB with the recipe's kernels, naming the terms and what to lower.
    """
    import yaml

    fsdp_ac = False
    if launcher and "--config_file" in launcher:
        acc = yaml.safe_load((REPO / launcher[launcher.index("--config_file") + 1]).read_text()) or {}
        fsdp_ac = bool((acc.get("fsdp_config") or {}).get("fsdp_activation_checkpointing"))

    args = training_args_of(script_argv)  # read with use_vllm off (no vLLM here): the recipe says whether it is on
    recipe = yaml.safe_load((REPO / script_argv[script_argv.index("--config") + 1]).read_text()) or {}
    flags = [script_argv[i + 1] for i, x in enumerate(script_argv[:-1]) if x == "--use_vllm"]
    use_vllm = str(flags[-1]).lower() == "true" if flags else bool(recipe.get("use_vllm", False))
    ckpt = bool(args.gradient_checkpointing) or fsdp_ac
    est = grpo_gpu_memory_gb(args, use_vllm, checkpointing=ckpt)
    fallback = grpo_gpu_memory_gb(args, use_vllm, checkpointing=ckpt, kernels="torch")["total"]
    parts = ", ".join(f"{k} {v:.1f}" for k, v in est.items() if k != "total")
    msg = (f"micro-batch {args.per_device_train_batch_size} x {args.max_state_prompt_tokens} + "
           f"{args.max_completion_length} tokens: ~{est['total']:.0f} GB per GPU with flash-linear-attention ({parts}; "
           f"{GPU_GB - est['total']:.0f} GB to spare), ~{fallback:.0f} GB on the PyTorch fallback")  # fmt: skip
    if est["total"] > GPU_GB:
        raise ValueError(msg + f" > {GPU_GB:.0f} GB: lower per_device_train_batch_size (raise "
                         "gradient_accumulation_steps to keep the groups per step) or vllm_gpu_memory_utilization")  # fmt: skip
    return msg


def check_thinking(recipes: Path, plan: dict[str, dict[str, Any]]) -> str:
    """Thinking on or off is one setting (``enable_thinking`` of the SFT recipe): the GRPO recipe agrees with
    it and run_all's data, GRPO and serving commands carry it. Raises ``ValueError`` naming the disagreement."""
    import yaml

    sft = yaml.safe_load((recipes / "sft.yaml").read_text()) or {}
    value = sft.get("enable_thinking")
    if not isinstance(value, bool):
        raise ValueError(f"{recipes / 'sft.yaml'}: enable_thinking must be true or false, not {value!r}")
    grpo = yaml.safe_load((recipes / "grpo.yaml").read_text()) or {}
    g = (grpo.get("chat_template_kwargs") or {}).get("enable_thinking")
    if g is not None and g != value:
        raise ValueError(f"{recipes / 'grpo.yaml'}: chat_template_kwargs.enable_thinking {g} but sft.yaml says {value}")
    word = "true" if value else "false"
    want = {
        "data": f'"enable_thinking": {word}',
        "grpo": f'{{"enable_thinking": {word}}}',
        "grpo-standard": f'{{"enable_thinking": {word}}}',
    }
    for stage, needle in want.items():
        cmd = plan.get(stage, {}).get("command", [])
        if not any(needle in arg for arg in cmd):
            raise ValueError(f"run_all's {stage} command does not pass enable_thinking {word}")
    for stage, entry in plan.items():
        wrapper = entry.get("servers") or []
        pinned = wrapper[wrapper.index("--enable-thinking") + 1] if "--enable-thinking" in wrapper else None
        if wrapper and pinned != word:
            raise ValueError(f"run_all's {stage} vLLM servers do not pin enable_thinking {word}")
    return (f"enable_thinking {word} (sft.yaml) reaches the data stage's requests, both GRPO runs, the saved "
            "templates and every vLLM server's template")


# ---------------------------------------------------------------------------- 5. machine, secrets
def _probe(url: str, timeout_s: float = 3.0) -> str | None:
    """``None`` when ``GET url/models`` answers, else why not."""
    try:
        with urllib.request.urlopen(url.rstrip("/") + "/models", timeout=timeout_s) as resp:
            return None if resp.status < 500 else f"HTTP {resp.status}"
    except Exception as exc:  # noqa: BLE001
        return type(exc).__name__ + (f" ({exc.reason})" if hasattr(exc, "reason") else "")


def check_endpoint(name: str, env: str, fallback: str | None, started_here: bool = False) -> tuple[str, str]:
    url = os.environ.get(env) or fallback
    source = f"${env}" if os.environ.get(env) else "the config"
    if not url:
        return "MISSING", f"set {env}"
    why = _probe(url)
    if why is None:
        return "OK", f"{url} (from {source}) answers"
    if started_here and not os.environ.get(env):
        return "WARN", f"{url} not answering now ({why}); run_all.sh starts a vLLM server there itself (or set {env})"
    return "MISSING", f"{url} (from {source}) not reachable ({why}); set {env} to a running OpenAI-compatible server (run_all.sh refuses to start the data stage without it)"


def vllm_binary_status() -> tuple[str, str]:
    """Whether ``with-vllm`` will find ``vllm`` in this environment's ``bin/`` (train/stages.py)."""
    import stages  # train/stages.py

    try:
        return "OK", stages.vllm_binary()
    except FileNotFoundError as exc:
        return "MISSING", str(exc)


def check_secret(env: str, purpose: str, alt: Callable[[], bool] | None = None) -> tuple[str, str]:
    if os.environ.get(env):
        return "OK", f"set ({purpose}); value not shown"
    if alt is not None and alt():
        return "OK", f"a stored token is available ({purpose}); value not shown"
    return "MISSING", f"not set ({purpose})"


def _hf_login() -> bool:
    from huggingface_hub import get_token

    return get_token() is not None


def gpus() -> tuple[str, str]:
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.TimeoutExpired):
        return "MISSING", "no NVIDIA GPU here (nvidia-smi not found); the 9B run needs 8 GPUs of 80 GB"
    n = sum(1 for line in out.splitlines() if line.startswith("GPU "))
    return ("OK" if n >= 8 else "WARN"), f"{n} GPU(s)" + ("" if n >= 8 else "; the 9B recipes are written for 8")


#: the GPU set (scripts/setup_gpu.sh installs them in this order): wheels, sdists built against its torch, --no-deps
GPU_REQUIREMENTS = (REPO / "requirements-gpu.txt", REPO / "requirements-gpu-build.txt",
                    REPO / "requirements-gpu-nodeps.txt")  # fmt: skip


def gpu_pins(requirements: Path | Sequence[Path] = GPU_REQUIREMENTS) -> dict[str, str]:
    """``{name: version}`` of every exact pin of the GPU set's requirements files (later files win on a repeat).

    Raises:
        FileNotFoundError: a file is missing. ValueError: a line that is not ``name==version`` (file and line named).
    """
    from reterm.training.kernels import read_pins

    pins: dict[str, str] = {}
    for path in [requirements] if isinstance(requirements, (str, Path)) else requirements:
        pins.update(read_pins(Path(path)))
    return pins


def gpu_package_checks(requirements: Path | Sequence[Path] = GPU_REQUIREMENTS,
                       machine: tuple[bool, bool, str] | None = None, **kwargs: Any) -> list[tuple[str, str, str]]:
    """The pinned packages of the GPU set as ``(item, status, detail)`` lines, then the machine and the Qwen3.5
    kernel functions transformers dispatches to here.

    Every pin of the three files (torch, transformers, vLLM, TRL, the kernels, harbor and its requirements) is
    compared with the installed version. A package that is missing or at another version than pinned (or Triton
    too old for fla's Hopper backward, or an installed vLLM whose torch/transformers requirements are not met) is
    ``FAIL`` on a machine with a CUDA GPU and ``WARN`` on one without: the 9B recipe runs on them only there.

    Args:
        requirements: the pins (default :data:`GPU_REQUIREMENTS`, the repository's three GPU requirements files).
        machine: ``(on_gpu, hopper, description)``, default :func:`reterm.training.kernels.cuda_summary`.
        kwargs: passed to :func:`reterm.training.kernels.check_gpu_packages` (a test's fake environment).
    """
    from reterm.training.kernels import check_gpu_packages, cuda_summary, kernels_in_use

    on_gpu, hopper, where = machine or cuda_summary()
    lines = [(c.name + (f"=={c.wanted}" if c.wanted[0].isdigit() else ""), c.status(on_gpu), c.detail)
             for c in check_gpu_packages(gpu_pins(requirements), hopper=hopper, **kwargs)]  # fmt: skip
    if "version_of" not in kwargs:  # what transformers really dispatches to in this environment
        used = kernels_in_use()
        fallback = [f for f, impl in used.items() if impl.startswith("torch fallback")]
        detail = "; ".join(f"{f} -> {impl}" for f, impl in used.items())
        status = "OK" if not fallback else ("FAIL" if on_gpu else "WARN")
        lines.append(("Qwen3.5 kernels in use", status, detail))
    lines.append(("CUDA (torch)", "OK" if on_gpu else "WARN",
                  where + ("" if on_gpu else ": kernel problems are warnings here, failures on a GPU machine")))  # fmt: skip
    return lines


# --------------------------------------------------------------------------------------------- main
def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="train/check_recipe.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--recipe", default="qwen3.5-9b", help="a folder of train/recipes/ (default qwen3.5-9b)")
    p.add_argument(
        "--run-dir", type=Path, default=None, help="where the one-step checks write (default runs/RECIPE/check)"
    )
    p.add_argument("--skip-steps", action="store_true", help="leave out the one-step trainer checks")
    p.add_argument("--plan", action="store_true",
                   help="print, as JSON, the commands run_all composes and what the check runs for each; run nothing")
    a = p.parse_args(argv)
    recipes = REPO / "train" / "recipes" / a.recipe
    if not recipes.is_dir():
        print(f"check_recipe: no recipe folder {recipes}", file=sys.stderr)
        return 2
    run_dir = (a.run_dir or Path("runs") / a.recipe / "check").resolve()
    os.environ.setdefault("HARBOR_TELEMETRY", "0")
    try:
        # the run_all commands of this check: the run folder is the check's, so every output lands under it
        plan = check_plan(composed_commands(a.recipe, run_dir))
    except (RuntimeError, ValueError) as exc:
        print(f"check_recipe: {exc}", file=sys.stderr)
        return 1
    if a.plan:
        print(json.dumps(plan, indent=1))
        return 0
    c = Checker()
    t0 = time.monotonic()

    print(f"== 1. recipes of {recipes.relative_to(REPO)} parse (TrlParser, unknown keys fail)")
    yamls = sorted(recipes.glob("*.yaml"))
    if not yamls:
        c.add("recipes", str(recipes), "FAIL", "no recipe files")
    for path in yamls:
        c.run("recipes", str(path.relative_to(REPO)), lambda path=path: check_recipe_file(path))

    print("== 2. the pipeline and eval configs of run_all's data and eval stages load; their vLLM servers")
    pipeline_cfg = None
    for stage, entry in plan.items():
        if "pipeline" in entry:
            pipe = entry["pipeline"]
            pipeline_cfg = (REPO / pipe["config"], pipe["set"])
            label = pipe["config"] + "".join(f" --set {x}" for x in pipe["set"])
            c.run("configs", f"{stage}: {label}", lambda pipe=pipe: check_pipeline(REPO / pipe["config"], pipe["set"]))
        if "eval" in entry:
            ev = entry["eval"]["config"]
            c.run("configs", f"{stage}: {ev}", lambda ev=ev: check_eval(REPO / ev))
            c.run("network", f"{ev} dataset", lambda ev=ev: check_eval_dataset(REPO / ev))
        if "servers" in entry:
            c.run("servers", f"{stage}: vLLM servers on 8 GPUs", lambda w=entry["servers"]: check_servers(w))

    if a.recipe == "qwen3.5-9b":
        c.run("configs", "thinking: one setting for every stage", lambda: check_thinking(recipes, plan))

    print("== 3. run_all's training commands take one step on the tiny Qwen3.5 (launcher -> python, + --check)")
    if a.skip_steps:
        c.add("steps", "one-step checks", "WARN", "skipped (--skip-steps)")
    else:
        for stage, entry in plan.items():
            if "run" in entry:
                print(f"     $ {shlex.join(entry['run'][1:])}")
                c.run("steps", stage, lambda e=entry: check_step(e["run"], _output_dir(e["run"]), run_dir / "logs"))

    print("== 4. run_all's launch commands compose for every accelerate config (accelerate's parser and merge)")
    for cfg in sorted((REPO / "train" / "accelerate_configs").glob("*.yaml")):
        try:
            cmds = composed_commands(a.recipe, run_dir, {"ACCELERATE_CONFIG": cfg.stem}, only=list(TRAINING_STAGES))
        except RuntimeError as exc:
            c.add("launch", cfg.name, "FAIL", str(exc))
            continue
        for stage, argv in cmds.items():
            if stage not in TRAINING_STAGES:
                continue
            launcher, script = split_launcher(argv)
            if "launch" not in launcher:
                c.add("launch", f"{cfg.name} {stage}", "OK", f"no accelerate launcher: {shlex.join(launcher)}")
                continue
            print(f"     $ {shlex.join(argv)}")
            c.run("launch", f"{cfg.name} {stage}", lambda la=launcher, sc=script: check_launch(la, sc))
    if a.recipe == "qwen3.5-9b":
        for stage in ("grpo", "grpo-standard"):
            if "launcher" in plan.get(stage, {}):
                launcher, script = split_launcher(plan[stage]["command"])
                c.run("memory", f"{stage} on 80 GB GPUs (measured terms)",
                      lambda sc=script, la=launcher: check_grpo_memory(sc, la))

    print("== 5. GPU set (requirements-gpu*.txt: failures on a GPU machine), machine, credentials, endpoints")
    c.add("machine", "GPUs", *gpus())
    for check in gpu_package_checks():
        c.add("kernels", *check)
    c.add("secrets", "HF_TOKEN", *check_secret("HF_TOKEN", "download Qwen3.5-9B, publish to the Hub", _hf_login))
    org = os.environ.get("HUB_ORG")
    c.add("secrets", "HUB_ORG", *(("OK", f"{org} (the cards stage publishes for real)") if org else
                                 ("MISSING", "not set: the cards stage publishes in dry-run only")))  # fmt: skip
    c.add(
        "secrets", "DAYTONA_API_KEY", *check_secret("DAYTONA_API_KEY", "Harbor's Daytona sandboxes: data, GRPO, eval")
    )
    c.add("machine", "vllm binary", *vllm_binary_status())
    if pipeline_cfg is not None:
        from reterm.data.build import _parse_set
        from reterm.data.config import load_config

        try:
            pcfg = load_config(pipeline_cfg[0], _parse_set(pipeline_cfg[1]))
        except Exception:  # noqa: BLE001 - reported in section 2
            pcfg = None
        if pcfg is not None and pcfg.rollout.policy.startswith("openai:"):
            c.add(
                "endpoints",
                "policy endpoint (vLLM)",
                *check_endpoint(
                    "policy", "RETERM_POLICY_URL", pcfg.rollout.policy_kwargs.get("base_url"), started_here=True
                ),
            )
        if pcfg is not None and pcfg.recovery.policy.startswith("openai:"):
            c.add(
                "endpoints",
                "teacher endpoint",
                *check_endpoint("teacher", "RETERM_TEACHER_URL", pcfg.recovery.policy_kwargs.get("base_url")),
            )

    fails = c.failed
    counts = {s: sum(1 for r in c.results if r.status == s) for s in ("OK", "WARN", "MISSING", "FAIL")}
    print(
        f"\n== check of recipe {a.recipe}: {counts['OK']} ok, {counts['WARN']} warnings, {counts['MISSING']} missing "
        f"(credentials, GPUs, endpoints: needed on the GPU machine, not here), {counts['FAIL']} failures "
        f"({time.monotonic() - t0:.0f} s)"
    )
    for r in fails:
        print(f"   FAIL {r.section}: {r.item}: {r.detail}")
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
