"""SFT on the real SmolLM2-135M (slow): the CPU recipe trains on the hand-made ReTerm-10K
fixture, its training loss falls, the held-out reference recoveries become more likely (printed, and
checked twice: TRL's eval loss before/after, and the per-record scorer on the base model vs the merged
checkpoint), and the merged checkpoint runs an episode in the agent harness on a real task in the local
sandbox.

Smaller than the recipe so it takes minutes on 2 idle cores: 4 training records (4 tasks), the recipe's
2 epochs (4 optimiser steps of 2 records), no warm-up, and the 4 held-out records of the same tasks.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
RECIPE_CPU = REPO / "train" / "recipes" / "smollm2-135m" / "sft.yaml"
FIXTURE = REPO / "tests" / "fixtures" / "reterm10k_mini"


def _sft_module():
    spec = importlib.util.spec_from_file_location("reterm_train_sft", REPO / "train" / "sft.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    out = tmp_path_factory.mktemp("sft") / "smollm2"
    argv = ["--config", str(RECIPE_CPU), "--output_dir", str(out), "--dataset_name", str(FIXTURE),
            "--max_train_samples", "4", "--max_eval_samples", "4", "--warmup_steps", "0",
            "--save_strategy", "no"]  # fmt: skip
    assert _sft_module().main(argv) == 0
    return out


@pytest.mark.slow
def test_loss_falls_and_heldout_likelihood_rises(trained, capsys):
    summary = json.loads((trained / "training_summary.json").read_text())
    assert summary["base_model"] == "smollm2" and summary["finetuning"] == "LoRA"
    assert summary["chat_template"] == "reterm/agent/templates/chatml_tools.jinja"
    assert summary["base_model_hub_id"] == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert summary["steps"] == 4 and summary["dataset_splits"] == {"train": 4, "test": 4}
    rows = [r.split(",") for r in (trained / "curves.csv").read_text().splitlines()[1:]]
    losses = [float(r[2]) for r in rows if r[2]]
    assert len(losses) == 4
    assert losses[2] + losses[3] < losses[0] + losses[1]  # epoch 2 (same records) below epoch 1
    held = summary["heldout"]
    print(f"\nTRL eval: held-out recovery NLL/token {held['base_nll_per_token']:.4f} (base) -> "
          f"{held['final_nll_per_token']:.4f} (SFT)")
    assert held["likelihood_improved"] and held["final_nll_per_token"] < held["base_nll_per_token"]


@pytest.mark.slow
def test_per_record_likelihood_base_vs_merged(trained):
    from reterm.training.likelihood import compare_models, markdown_table

    merged = str(trained / "merged")
    report = compare_models(["smollm2", merged], str(FIXTURE), "test", max_records=4)
    print("\n" + markdown_table(report))
    assert report["mean_nll"][merged] < report["mean_nll"]["smollm2"]
    improved = sum(r[merged]["nll"] < r["smollm2"]["nll"] for r in report["records"])
    assert improved >= 3  # of 4 held-out records


@pytest.mark.slow
def test_merged_model_runs_an_episode_in_the_harness(trained):
    from sandbox_support import HELLO_TASK, run

    from reterm.agent.episode import run_episode, run_verifier
    from reterm.policies import load_policy
    from reterm.sandbox.local import LocalEnvironment

    policy = load_policy(f"hf:{trained / 'merged'}", temperature=0, max_new_tokens=96)
    assert type(policy.model).__name__ == "LlamaForCausalLM"

    async def episode():
        async with LocalEnvironment.for_task(HELLO_TASK) as env:
            traj = await run_episode(policy, env, HELLO_TASK, max_turns=3)
            await run_verifier(env, HELLO_TASK, traj)
        return traj

    traj = run(episode())
    assert not traj.outcome.is_infra_fault, traj.error
    assert traj.steps and traj.reward is not None
    print(f"\nepisode: {len(traj.steps)} steps, stop={traj.stop_reason}, reward={traj.reward}, "
          f"actions={[s.action.tool if s.action else s.parse_error for s in traj.steps]}")
