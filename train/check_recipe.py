"""``bash train/run_all.sh --recipe NAME --check``: validate a recipe's whole chain on a machine without GPUs.

    python train/check_recipe.py --recipe qwen3.5-9b [--run-dir runs/qwen3.5-9b/check] [--skip-steps]

What it checks, in order (each line says OK, WARN, MISSING or FAIL):

1. **Recipes parse**: every YAML of ``train/recipes/NAME/`` through the training script's own ``TrlParser``
   (``train/sft.py`` for ``sft*.yaml``, ``train/grpo.py`` for ``grpo*.yaml``: unknown keys fail), read with
   the CPU-safe values a GPU recipe needs here (``bf16``/``fp16``/``tf32`` off, ``use_cpu``, no vLLM).
2. **Pipeline and eval configs load**: the recipe's pipeline config (:func:`reterm.data.config.load_config`),
   its endpoint policies are constructed (no request is sent), and every eval config the recipe uses
   (:func:`reterm.eval.run.load_config`) is turned into Harbor ``JobConfig``s, one per model; a registry dataset
   that cannot be reached is a WARN (offline machines use a local copy: ``-p DIR``).
3. **Trainers build and take one step** on the tiny Qwen3.5 with the recipes' own code path: the scripts'
   ``--check`` (``train/sft.py --check``, ``train/grpo.py --check`` for ReTerm-GRPO and for the standard
   baseline); outputs under ``--run-dir``; ``--skip-steps`` leaves this out.
4. **Launch commands compose**: for every ``train/accelerate_configs/*.yaml``, ``accelerate launch
   --config_file CONFIG train/sft.py ...`` (and ``train/grpo.py``) is parsed by accelerate's own launch parser
   and its config merge (accelerate's ``_validate_launch_command``; accelerate has no public dry run), and
   the command is printed. DeepSpeed itself is needed only on the GPU machine (reported if missing).
5. **GPU machine and credentials** (reported, never a failure here): GPUs, ``vllm``/``deepspeed``
   importable, ``HF_TOKEN`` (or a ``hf auth login`` token), ``HUB_ORG``, ``DAYTONA_API_KEY``, the policy
   and teacher endpoints (``RETERM_POLICY_URL``, ``RETERM_TEACHER_URL``, else the configs' URLs, probed with
   ``GET /models``). Secrets are never printed: only whether they are set.

Exit status: 1 when a FAIL was found (a config that does not parse, a trainer that does not build or step,
a launch command that does not compose), else 0; WARN and MISSING (credentials, GPUs, network) do not fail.
Written for this kit: it strings together the checks each part already offers.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

# The configs each recipe's run uses besides its training recipes (keep in step with train/run_all.sh).
RECIPE_CONFIGS = {
    "smollm2-135m": {"pipeline": "pipeline/configs/smoke.yaml", "eval": ["eval/configs/local.yaml"]},
    "qwen3.5-9b": {"pipeline": "pipeline/configs/reterm-10k.yaml",
                   "eval": ["eval/configs/terminal-bench-2.0.yaml", "eval/configs/terminal-bench-2.1.yaml"]},
}  # fmt: skip
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
def check_pipeline(path: Path) -> str:
    """Load the pipeline config and construct its endpoint policies (nothing is sent)."""
    from reterm.agent.environments import environment_kind
    from reterm.data.config import load_config
    from reterm.policies import load_policy

    cfg = load_config(path)
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
def check_step(script: str, recipe: Path, out_dir: Path, extra: list[str], log_dir: Path) -> str:
    """Run ``train/SCRIPT --config RECIPE --check`` (tiny Qwen3.5, one step) in a subprocess."""
    log_dir.mkdir(parents=True, exist_ok=True)
    log = log_dir / f"{out_dir.name}.log"
    shown = recipe.relative_to(REPO) if recipe.is_relative_to(REPO) else recipe
    cmd = [sys.executable, f"train/{script}", "--config", str(shown), "--check", "--output_dir", str(out_dir), *extra]
    t0 = time.monotonic()
    with open(log, "w") as fh:
        code = subprocess.call(
            cmd, cwd=REPO, stdout=fh, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"}
        )
    wall = time.monotonic() - t0
    if code != 0:
        tail = log.read_text(errors="replace").strip().splitlines()[-3:]
        raise RuntimeError(f"`{' '.join(cmd[1:])}` exited {code} after {wall:.0f} s; log {log}: " + " | ".join(tail))
    summary = Path(f"{out_dir}-check") / "training_summary.json"
    if not summary.is_file():
        raise RuntimeError(f"{summary} was not written (log {log})")
    import json

    s = json.loads(summary.read_text())
    if s.get("steps") != 1:
        raise RuntimeError(f"{summary}: {s.get('steps')} steps, expected 1")
    return f"tiny Qwen3.5, 1 step in {wall:.0f} s ({Path(f'{out_dir}-check').relative_to(REPO) if Path(f'{out_dir}-check').is_relative_to(REPO) else out_dir}-check)"


# --------------------------------------------------------------------------------- 4. accelerate
def launch_command(config: Path, script: str, recipe: Path, extra: list[str] | None = None) -> list[str]:
    """``accelerate launch --config_file CONFIG train/SCRIPT --config RECIPE ...`` as run_all.sh composes it."""
    return [
        "accelerate",
        "launch",
        "--config_file",
        str(config),
        f"train/{script}",
        "--config",
        str(recipe),
        *(extra or []),
    ]


def check_launch(cmd: list[str]) -> str | tuple[str, str]:
    """Parse a launch command with accelerate's parser and merge its config file (no process starts)."""
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser

    args = launch_command_parser().parse_args(cmd[2:])
    args, defaults, _ = _validate_launch_command(args)
    kind = (
        "DeepSpeed" if args.use_deepspeed else "FSDP" if args.use_fsdp else "multi-GPU" if args.multi_gpu else "single"
    )
    detail = (
        f"{kind}, {args.num_processes} processes x {args.num_machines} machine(s), mixed precision "
        f"{args.mixed_precision}"
    )
    if args.use_fsdp:
        from accelerate.utils.launch import prepare_multi_gpu_env

        env = prepare_multi_gpu_env(args)
        detail += f", FSDP v{env.get('FSDP_VERSION', '1')} {env.get('FSDP_AUTO_WRAP_POLICY', '')}"
    if args.use_deepspeed:
        stage = (defaults.deepspeed_config or {}).get("zero_stage")
        detail += f", ZeRO stage {stage}"
        if importlib.util.find_spec("deepspeed") is None:
            return "WARN", detail + "; deepspeed is not installed here (pip install deepspeed on the GPU machine)"
    return detail


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
    return "MISSING", f"{url} (from {source}) not reachable ({why}); set {env} to a running OpenAI-compatible server"


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


def package(name: str, why: str) -> tuple[str, str]:
    if importlib.util.find_spec(name) is None:
        return "MISSING", f"not installed ({why}; install on the GPU machine)"
    from importlib.metadata import version

    return "OK", f"{version(name)}"


# --------------------------------------------------------------------------------------------- main
def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="train/check_recipe.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--recipe", default="qwen3.5-9b", help="a folder of train/recipes/ (default qwen3.5-9b)")
    p.add_argument(
        "--run-dir", type=Path, default=None, help="where the one-step checks write (default runs/RECIPE/check)"
    )
    p.add_argument("--skip-steps", action="store_true", help="leave out the one-step trainer checks")
    a = p.parse_args(argv)
    recipes = REPO / "train" / "recipes" / a.recipe
    if not recipes.is_dir():
        print(f"check_recipe: no recipe folder {recipes}", file=sys.stderr)
        return 2
    run_dir = (a.run_dir or Path("runs") / a.recipe / "check").resolve()
    configs = RECIPE_CONFIGS.get(a.recipe, {"pipeline": None, "eval": []})
    c = Checker()
    t0 = time.monotonic()
    os.environ.setdefault("HARBOR_TELEMETRY", "0")

    print(f"== 1. recipes of {recipes.relative_to(REPO)} parse (TrlParser, unknown keys fail)")
    yamls = sorted(recipes.glob("*.yaml"))
    if not yamls:
        c.add("recipes", str(recipes), "FAIL", "no recipe files")
    for path in yamls:
        c.run("recipes", str(path.relative_to(REPO)), lambda path=path: check_recipe_file(path))

    print("== 2. pipeline and eval configs load")
    if configs["pipeline"]:
        c.run("configs", configs["pipeline"], lambda: check_pipeline(REPO / configs["pipeline"]))
    for ev in configs["eval"]:
        c.run("configs", ev, lambda ev=ev: check_eval(REPO / ev))
        c.run("network", f"{ev} dataset", lambda ev=ev: check_eval_dataset(REPO / ev))

    print("== 3. trainers build on the tiny Qwen3.5 with the recipes' code path and take one step")
    if a.skip_steps:
        c.add("steps", "one-step checks", "WARN", "skipped (--skip-steps)")
    else:
        logs = run_dir / "logs"
        if (recipes / "sft.yaml").is_file():
            c.run("steps", "SFT", lambda: check_step("sft.py", recipes / "sft.yaml", run_dir / "sft", [], logs))
        if (recipes / "grpo.yaml").is_file():
            c.run(
                "steps",
                "ReTerm-GRPO",
                lambda: check_step("grpo.py", recipes / "grpo.yaml", run_dir / "grpo-reterm", [], logs),
            )
            std = recipes / "grpo_standard.yaml"
            std_args = [] if std.is_file() else ["--mode", "standard"]
            c.run("steps", "standard GRPO", lambda: check_step("grpo.py", std if std.is_file() else recipes / "grpo.yaml",
                                                                run_dir / "grpo-standard", std_args, logs))  # fmt: skip

    print("== 4. accelerate launch commands compose (accelerate's own parser and config merge)")
    for cfg in sorted((REPO / "train" / "accelerate_configs").glob("*.yaml")):
        rel = cfg.relative_to(REPO)
        for script, recipe, extra in (("sft.py", recipes / "sft.yaml", []), ("grpo.py", recipes / "grpo.yaml", [])):
            if not recipe.is_file():
                continue
            fsdp_extra = ["--activation_checkpointing", "false"] if "fsdp" in cfg.name else []
            cmd = launch_command(rel, script, recipe.relative_to(REPO), extra + fsdp_extra)
            print(f"     $ {' '.join(cmd)}")
            c.run("launch", f"{rel.name} + {script}", lambda cmd=cmd: check_launch(cmd))

    print("== 5. GPU machine, credentials and endpoints (reported; not failures here)")
    c.add("machine", "GPUs", *gpus())
    c.add("machine", "vllm", *package("vllm", "generation in GRPO and serving for the data and eval stages"))
    c.add("machine", "deepspeed", *package("deepspeed", "ZeRO-3 (train/accelerate_configs/zero3.yaml)"))
    c.add("secrets", "HF_TOKEN", *check_secret("HF_TOKEN", "download Qwen3.5-9B, publish to the Hub", _hf_login))
    org = os.environ.get("HUB_ORG")
    c.add("secrets", "HUB_ORG", *(("OK", f"{org} (the cards stage publishes for real)") if org else
                                 ("MISSING", "not set: the cards stage publishes in dry-run only")))  # fmt: skip
    c.add(
        "secrets", "DAYTONA_API_KEY", *check_secret("DAYTONA_API_KEY", "Harbor's Daytona sandboxes: data, GRPO, eval")
    )
    if configs["pipeline"]:
        from reterm.data.config import load_config

        try:
            pcfg = load_config(REPO / configs["pipeline"])
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
