"""A few SFT steps on drill records change what SmolLM2 does (issue 30, item 5): on held-out drill instances the
SFT model's first reply is a valid tool call far more often than the base model's.

Real parts end to end: drills written and their records built in the local sandbox (``pipeline.drills``: injected
first mistakes, whole reference solutions, typed two-stage solutions and recoveries, every record verified), ``train/sft.py`` with the CPU
recipe (LoRA, bf16 autocast where the CPU has it) for 16 optimiser steps, and the harness's own policy
(:class:`reterm.policies.transformers_policy.TransformersPolicy`, greedy, the shared 96-token turn) on the first turn
of the held-out ``test`` instances, parsed by the harness's parser. Stated margin: the base model makes at most
20% valid first tool calls, the SFT model at least 50 points more.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
FAMILIES = ["mkdir-parent", "exec-bit", "python-alias", "wc-number", "copy-dir"]


def _sft_main(argv: list[str]) -> int:
    spec = importlib.util.spec_from_file_location("reterm_train_sft_behaviour", REPO / "train" / "sft.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module.main(argv)


def _valid_first_calls(spec: str, instructions: list[str]) -> float:
    from reterm.agent.protocol import OK_OUTCOMES, TOOLS, initial_messages, parse_action
    from reterm.generation import MAX_TURN_TOKENS
    from reterm.policies import load_policy

    policy = load_policy(spec, temperature=0.0, max_new_tokens=MAX_TURN_TOKENS)
    gens = policy.generate([initial_messages(i, TOOLS) for i in instructions], TOOLS)
    return sum(parse_action(g.text).outcome in OK_OUTCOMES for g in gens) / len(gens)


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_a_few_sft_steps_raise_valid_first_tool_calls_on_held_out_drills(tmp_path):
    from reterm.agent.episode import load_task
    from reterm.data.drills import build, read_splits
    from reterm.drills import generate_drills
    from reterm.drills.multistage import add_train_instances

    drills = tmp_path / "drills"
    generate_drills(drills, 0, 6, families=FAMILIES, ood_families=[], test_fraction=0.34)
    add_train_instances(drills, 4)
    build(drills, tmp_path / "data", policies=[], max_turns=3, batch=16, held_out=0.1, injected_per_family=2,
          reference_per_family=2)
    out = tmp_path / "sft"
    assert _sft_main(["--config", str(REPO / "train/recipes/smollm2-135m/sft.yaml"), "--dataset_name",
                      str(tmp_path / "data"), "--output_dir", str(out), "--max_steps", "16", "--warmup_steps", "2",
                      "--eval_strategy", "no", "--eval_on_start", "false", "--save_strategy", "no"]) == 0  # fmt: skip
    held_out = [load_task(drills / n).instruction for n in read_splits(drills)["test"]]
    assert len(held_out) >= 10
    base = _valid_first_calls("smollm2", held_out)
    sft = _valid_first_calls(f"hf:{out / 'merged'}", held_out)
    print(f"\nvalid first tool calls on {len(held_out)} held-out drills: base {base:.2f}, after 16 SFT steps {sft:.2f}")
    assert base <= 0.2
    assert sft >= base + 0.5
