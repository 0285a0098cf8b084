"""The GRPO recipes parse, and ``train/grpo.py --check`` runs a recipe's code path for one real step on the
tiny Qwen3.5 (local sandbox, real verifier, transformers generation): the 9B recipe (ReTerm mode) and the
CPU baseline recipe (standard mode). The checkpoints load in the harness (``hf:<folder>``)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
RECIPES = REPO / "train" / "recipes"


def _script(name: str):
    """``train/<name>.py`` as a module (registered in ``sys.modules``: its dataclasses need that)."""
    key = f"reterm_train_{name}"
    if key in sys.modules:
        return sys.modules[key]
    spec = importlib.util.spec_from_file_location(key, REPO / "train" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _grpo_script():
    return _script("grpo")


@pytest.mark.parametrize("name", ["smollm2-135m/grpo.yaml", "smollm2-135m/grpo_standard.yaml"])
def test_cpu_recipes_parse_with_the_same_budget(name):
    grpo = _grpo_script()
    script, args, model = grpo.parse_args(["--config", str(RECIPES / name)])[:3]
    assert script.dataset_name == "runs/smollm2-135m/data" and args.task_dirs == ["runs/smollm2-135m/drills"]
    assert model.use_peft
    assert args.mode == ("standard" if "standard" in name else "reterm") and args.resolved_fork_method == "snapshot"
    from reterm.drills.multistage import turn_budget

    # a four-stage chain's turns; 14 turns of 96 tokens (1,344) and the longest chain reference fit the budget
    assert (args.num_generations, args.max_steps, args.max_turns, args.max_turn_tokens, args.max_completion_length) == (
        4, 15, turn_budget(4), 96, 1536)  # fmt: skip
    assert args.max_turns * args.max_turn_tokens <= args.max_completion_length
    assert args.generation_batch_size == 8 and args.use_cpu and args.bf16  # autocast where the CPU has bf16
    assert script.seed_tasks == "chain4-*"  # both arms on the four-stage train chains
    # ReTerm's seed states: the injected failed attempts there (the standard arm starts from the tasks' starts)
    assert script.seed_failure_sources == (None if "standard" in name else ["injected"])
    # one attempt per micro-batch (peak memory), two whole groups per optimiser step, generated together
    assert (args.per_device_train_batch_size, args.gradient_accumulation_steps, args.steps_per_generation) == (1, 8, 8)
    assert (args.skip_equal_after, args.skip_equal_explore) == (2, 0.2)  # the same skipping rule in both arms


def test_command_line_overrides_any_recipe_field():
    grpo = _grpo_script()
    recipe = str(RECIPES / "smollm2-135m" / "grpo.yaml")
    script, args, model = grpo.parse_args(["--config", recipe, "--max_steps", "3", "--max_turns", "1",
                                           "--dataset_name", "elsewhere", "--model_name_or_path", "m",
                                           "--task_dirs", "a", "b", "--save_strategy", "no"])[:3]  # fmt: skip
    assert (args.max_steps, args.max_turns, script.dataset_name, model.model_name_or_path) == (3, 1, "elsewhere", "m")
    assert args.task_dirs == ["a", "b"] and args.save_strategy == "no" and args.num_generations == 4


def test_9b_recipe_fields_and_check_overrides():
    grpo = _grpo_script()
    raw = yaml.safe_load((RECIPES / "qwen3.5-9b" / "grpo.yaml").read_text())
    assert raw["use_vllm"] and raw["vllm_mode"] == "colocate" and raw["vllm_tensor_parallel_size"] == 1
    assert raw["environment"] == "daytona" and raw["fork_method"] == "replay" and raw["num_generations"] == 8
    script, args, model, argv = grpo.parse_args(["--config", str(RECIPES / "qwen3.5-9b" / "grpo.yaml"), "--check"])
    assert model.model_name_or_path == "tiny-qwen3.5" and not args.use_vllm and args.environment == "local"
    assert args.max_steps == 1 and args.num_generations == 2 and args.output_dir.endswith("-check")
    assert args.chat_template_kwargs == {"enable_thinking": False} and args.dynamic_sampling == "none"
    assert args.task_dirs == ["tasks", "tests/fixtures/tasks"] and script.max_train_samples == 2


def _check_run(recipe: Path, out: Path) -> Path:
    grpo = _grpo_script()
    assert grpo.main(["--config", str(recipe), "--check", "--output_dir", str(out)]) == 0
    done = Path(f"{out}-check")
    summary = json.loads((done / "training_summary.json").read_text())
    assert summary["steps"] == 1 and summary["check_run"] and summary["attempts"] == 2
    assert (done / "curves.csv").is_file() and (done / "curves.png").stat().st_size > 1000
    header = (done / "curves.csv").read_text().splitlines()[0]
    assert "reterm/zero_variance_group_share" in header and "reterm/submitted_share" in header
    assert 0 <= summary["submitted_attempts"] <= summary["scored_attempts"]
    if summary["hyperparameters"]["merged_generation"]:  # synced at construction; one step: no weight change before
        assert summary["generation_copy_syncs"] == 1  # its rollout (tests/test_grpo_trainer.py checks the re-sync)
    return done


def _loads_in_the_harness(folder: Path, prompt: list[dict]) -> None:
    from reterm.policies import load_policy

    policy = load_policy(f"hf:{folder}", max_new_tokens=4, enable_thinking=False)
    (gen,) = policy.generate([prompt], [])
    assert 0 < gen.completion_tokens <= 4


@pytest.mark.slow
def test_9b_recipe_check_runs_one_step(tmp_path):
    done = _check_run(RECIPES / "qwen3.5-9b" / "grpo.yaml", tmp_path / "q9b")
    (rollout,) = sorted((done / "rollouts").glob("*.jsonl"))
    rows = [json.loads(line) for line in rollout.read_text().splitlines()]
    assert len(rows) == 2 and {r["pool_origin"] for r in rows} == {"seed"}
    assert all(r["trajectory"]["prefix_len"] > 0 and r["reward"] is not None for r in rows)  # real verifier
    _loads_in_the_harness(done, [{"role": "user", "content": "hello"}])


@pytest.mark.slow
def test_standard_recipe_check_runs_from_the_task_start(tmp_path):
    done = _check_run(RECIPES / "smollm2-135m" / "grpo_standard.yaml", tmp_path / "std")
    (rollout,) = sorted((done / "rollouts").glob("*.jsonl"))
    rows = [json.loads(line) for line in rollout.read_text().splitlines()]
    assert {r["state_source"] for r in rows} == {"task_start"} and {r["state_id"] for r in rows} == {"start:hello-file"}
    assert all(r["trajectory"]["prefix_len"] == 0 for r in rows)
    assert (done / "adapter_config.json").is_file()  # the CPU recipe trains a LoRA adapter
    _loads_in_the_harness(done, [{"role": "user", "content": "hello"}])
    # the run's drift diagnostics: KL to the start on its own attempts, gradient norm and advantages per step
    summary = json.loads((done / "training_summary.json").read_text())
    kl = summary["kl_to_start"]
    assert kl["attempts"] == 2 and kl["tokens"] > 0 and kl["kl_k3"] >= 0
    diag = summary["diagnostics"]
    assert diag["grad_norm"]["n"] == 1 and diag["advantage_nonzero_share"]["n"] == 1


@pytest.mark.parametrize("script", ["grpo", "sft"])
@pytest.mark.parametrize("missing", ["model_name_or_path", "dataset_name"])
def test_entry_scripts_name_a_missing_model_or_dataset(script, missing, tmp_path):
    """A recipe without a model or a dataset fails before anything loads, naming the field (both scripts)."""
    module = _script(script)
    recipe = yaml.safe_load((RECIPES / "smollm2-135m" / f"{script}.yaml").read_text())
    recipe.pop(missing)
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe))
    with pytest.raises(ValueError, match=f"^{missing} is not set"):
        module.main(["--config", str(path), "--output_dir", str(tmp_path / "out")])
    assert not (tmp_path / "out").exists()


def test_seed_failure_sources_keeps_only_those_records_in_the_reterm_pool(tmp_path):
    """``--seed_failure_sources`` filters the records that seed ReTerm-GRPO's pool by ``failure_source``
    (the fixture's injected states, half relabelled ``own``); an unknown source names itself; standard
    mode starts from task starts and ignores it."""
    import pandas as pd
    from transformers import AutoTokenizer

    from reterm.policies.smollm2 import embedded_model_path

    grpo = _grpo_script()
    rows = pd.read_parquet(REPO / "tests" / "fixtures" / "grpo_seed" / "data" / "train-00000-of-00001.parquet")
    rows.loc[rows.index[::2], "failure_source"] = "own"
    (tmp_path / "data").mkdir()
    rows.to_parquet(tmp_path / "data" / "train-00000-of-00001.parquet")
    tokenizer = AutoTokenizer.from_pretrained(embedded_model_path())
    task_dirs = [str(REPO / d) for d in grpo.CHECK_TASK_DIRS]

    def pool(*extra):
        argv = ["--config", str(RECIPES / "smollm2-135m" / "grpo.yaml"), "--dataset_name", str(tmp_path / "data"),
                "--seed_tasks", "", "--task_dirs", *task_dirs, *extra]  # fmt: skip
        script, args = grpo.parse_args(argv)[:2]
        return grpo.build_pool(script, args, tokenizer)

    recipe = pool()  # the CPU recipe's own setting: injected only
    own = pool("--seed_failure_sources", "own")
    both = pool("--seed_failure_sources", "own", "injected")
    assert {s.state_source.value for s in own.seeds} == {"own"}
    assert {s.state_source.value for s in recipe.seeds} == {"injected"}
    assert len(own) + len(recipe) == len(both) == len(rows) and len(own) > 0 and len(recipe) > 0
    with pytest.raises(ValueError, match=r"seed_failure_sources: \['task_start'\]"):
        pool("--seed_failure_sources", "task_start")
    standard = pool("--mode", "standard", "--seed_failure_sources", "own")
    assert {s.state_source.value for s in standard.seeds} == {"task_start"}


@pytest.mark.slow  # about 100 s on 2 busy cores: the data stage's scripted attempts on 8 drills in the real sandbox
def test_the_cpu_recipes_seed_from_four_stage_chains_with_every_stages_done(tmp_path):
    """The data stage's records on four-stage train chains (scripted: ``j`` stages of the reference, then a submit or
    the next stage's natural mistake) seed ReTerm-GRPO's pool under the CPU recipe's ``seed_tasks`` and
    ``seed_failure_sources``: only ``chain4-*`` states, from every number of stages done (0 to 3); the standard
    recipe starts from those chains' starts."""
    from transformers import AutoTokenizer

    from reterm.data.drills import build
    from reterm.drills import generate_drills
    from reterm.drills.generate import stage_parts
    from reterm.drills.multistage import add_train_instances, record_kinds, resume_plan
    from reterm.policies.smollm2 import embedded_model_path
    from reterm.training.sft_data import load_records

    drills, data = tmp_path / "drills", tmp_path / "data"
    generate_drills(drills, 0, 1, families=["mkdir-parent", "exec-bit", "off-by-one", "git-identity"], ood_families=[])
    add_train_instances(drills, 1)  # a two-stage drill: its records are not the recipes' seeds
    add_train_instances(drills, len(record_kinds(4)), stages=4)  # one chain per scripted kind
    build(drills, data, max_turns=4, batch=8, held_out=0.0, injected_per_family=0)
    records = {r["trajectory_id"]: r for r in load_records(str(data), "train")}
    grpo = _grpo_script()
    tokenizer = AutoTokenizer.from_pretrained(embedded_model_path())

    def pool(name):
        script, args = grpo.parse_args(["--config", str(RECIPES / "smollm2-135m" / name), "--dataset_name", str(data),
                                        "--task_dirs", str(drills)])[:2]  # fmt: skip
        return grpo.build_pool(script, args, tokenizer)

    seeds = pool("grpo.yaml").seeds
    assert seeds and all(s.task_id.startswith("chain4-") for s in seeds)
    assert {s.state.source.value if hasattr(s.state.source, "value") else s.state.source for s in seeds} == {"injected"}
    done = set()
    for s in seeds:
        r = records[s.state_id]
        done.add(resume_plan(stage_parts(drills / r["task_id"]), r["injection"])[2])
    assert done == {0, 1, 2, 3}
    standard = pool("grpo_standard.yaml").seeds
    assert sorted(s.task_id for s in standard) == sorted({r["task_id"] for r in records.values()
                                                          if r["task_id"].startswith("chain4-")})  # fmt: skip
