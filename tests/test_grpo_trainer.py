"""ReTerm-GRPO end to end on real parts: the local sandbox (replay, snapshot, G forks), the task's real
verifier, Harbor's verifier semantics for infrastructure faults, the tiny Qwen3.5 computing the loss, and
scripted replies whose attempts differ (so that rewards differ inside a group).

Checked: non-zero advantages inside a group (positive for passes, negative for failures), exactly G forks
per failure state, no loss on observation tokens (the masked tokens are exactly the template's rendering
of the observations), an infrastructure fault carries no reward and zero loss weight, an online failure
state found in a failed attempt starts the next group (rebuilt from its parent's snapshot), the saved
checkpoint loads in the harness, and no sandbox, mount or snapshot is left behind."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from datasets import load_dataset
from sandbox_support import HELLO_TASK

from reterm.policies.scripted import assistant_commands, bash_call, submit_call
from reterm.sandbox.box import live_boxes
from reterm.sandbox.paths import sub
from reterm.sandbox.snapshot import list_snapshots

FIXTURES = Path(__file__).resolve().parent / "fixtures"
G = 4
TASK = "hello-grpo-test"
# by attempt (= chain id): two recoveries, one failure, one attempt whose verifier writes no reward
COMMANDS = {
    0: "printf 'Hello, world!\\n' > /app/hello.txt",
    1: "printf 'Hello, world!\\n' > /app/hello.txt && cat /app/hello.txt",
    2: "echo nope",
    3: "touch /app/noreward",
}


def _task(root: Path) -> Path:
    """hello-file, except that its verifier writes no reward file when /app/noreward exists (Harbor: a
    missing reward file is a verifier error, an infrastructure fault, never a zero)."""
    task = root / TASK
    shutil.copytree(HELLO_TASK, task)
    test_sh = task / "tests" / "test.sh"
    test_sh.write_text(test_sh.read_text().replace("mkdir -p /logs/verifier\n",
                                                   "mkdir -p /logs/verifier\n[ -e /app/noreward ] && exit 0\n"))  # fmt: skip
    return task


def _reply(chain_id: int, messages: list[dict]) -> str:
    mine = COMMANDS[chain_id % G]
    return submit_call("qwen") if mine in assistant_commands(messages) else bash_call(mine, call_format="qwen")


def _leftovers(marker: str) -> dict:
    runs = []
    for d in sub("run").iterdir():
        try:
            if json.loads((d / "state.json").read_text()).get("owner_pid") == os.getpid():
                runs.append(d.name)
        except (OSError, ValueError):
            continue
    mounts = [ln.split()[4] for ln in Path("/proc/self/mountinfo").read_text().splitlines()
              if str(sub("run")) in ln.split()[4]]  # fmt: skip
    snaps = [s.id for s in list_snapshots() if s.meta.get("environment_name") == marker]
    return {"boxes": [b.id for b in live_boxes()], "runs": runs, "mounts": [m for m in mounts if any(r in m for r in runs)],
            "snapshots": snaps}  # fmt: skip


@pytest.mark.slow
def test_reterm_grpo_steps_on_real_sandboxes(tmp_path):
    import torch
    from transformers import AutoModelForCausalLM

    from reterm.policies import load_policy
    from reterm.training.failure_pool import FailurePool, seed_states_from_records
    from reterm.training.grpo_config import ReTermGRPOConfig
    from reterm.training.grpo_policy import scripted_generate_fn
    from reterm.training.grpo_trainer import ReTermGRPOTrainer
    from reterm.training.models import load_tokenizer, resolve_model_name_or_path

    task = _task(tmp_path / "tasks")
    record = load_dataset(str(FIXTURES / "grpo_seed"), split="train")[0]  # hello-file: write to /ap/ (typo)
    assert record["task_id"] == "hello-file"
    (seed,), skipped = seed_states_from_records([dict(record, task_id=TASK)], [task.parent])
    before = _leftovers(TASK)

    path = resolve_model_name_or_path("tiny-qwen3.5")
    tok = load_tokenizer(path)
    args = ReTermGRPOConfig(
        # a group spans two micro-batches (2 x 2), as in the CPU recipes (1 x 4): generated and scored together
        output_dir=str(tmp_path / "out"), per_device_train_batch_size=2, gradient_accumulation_steps=2,
        num_generations=G, max_steps=2,
        max_turns=3, max_turn_tokens=64, max_completion_length=320, learning_rate=1e-3, use_cpu=True, bf16=False,
        report_to="none", logging_steps=1, save_strategy="no", task_dirs=[str(task.parent)], online_state_fraction=1.0,
        chat_template_kwargs={"enable_thinking": False}, seed=3, skip_equal_after=1,
        online_states_from="signal_groups",  # the CPU recipe's: the seed group's rewards differ, so it gives one
        merged_generation=True,  # the copy is synced (the scripted replies do not use it)
    )  # fmt: skip
    pool = FailurePool([seed], online_fraction=1.0, seed=3)
    trainer = ReTermGRPOTrainer(AutoModelForCausalLM.from_pretrained(path), args, pool, processing_class=tok,
                                generate_fn=scripted_generate_fn(tok, _reply))  # fmt: skip
    _start_weight = next(p for p in trainer.model.parameters() if p.requires_grad).detach().clone()
    copy, synced = trainer.generation_copy, []
    sync = copy.sync
    copy.sync = lambda policy: synced.append(next(p for p in policy.parameters() if p.requires_grad).detach().clone()) or sync(policy)
    outputs = []
    inner = trainer._generate_and_score_completions
    trainer._generate_and_score_completions = lambda inputs: outputs.append(inner(inputs)) or outputs[-1]
    assert args.generation_batch_size == G and args.steps_per_generation == 2
    trainer.train()

    assert pool.equal_streak[seed.state_id] == 0  # its group's rewards differed: the trainer recorded it
    # the merged copy: built with the start's weights, re-synced once, before step 2's rollout, with the new weights
    assert copy.syncs == 2 and len(synced) == 1
    first = next(p for p in copy.model.parameters())
    assert torch.equal(first, synced[0].to(first.dtype)) and not torch.equal(synced[0], _start_weight)
    rounds = sorted((tmp_path / "out" / "rollouts").glob("round-*.jsonl"))
    assert len(rounds) == 2 and len(outputs) == 2
    rows = [json.loads(line) for line in rounds[0].read_text().splitlines()]

    # --- step 1: the seed state; exactly G forks of one snapshot, rewards differ, one infrastructure fault
    assert [r["state_id"] for r in rows] == [seed.state_id] * G and [r["attempt"] for r in rows] == list(range(G))
    envs = [r["environment_id"] for r in rows]
    snap_id = envs[0].split("fork-")[1].rsplit("-", 1)[0]
    assert envs == [f"{TASK}__fork-{snap_id}-{i}" for i in range(G)]
    assert [r["reward"] for r in rows] == [1.0, 1.0, 0.0, None]
    assert rows[3]["outcome"] == "verifier_error" and rows[3]["mask_reason"] == "infra_fault"
    out = outputs[0]
    adv = out["advantages"].tolist()
    assert adv[0] > 0 and adv[1] > 0 and adv[2] < 0 and adv[3] == 0.0  # non-zero advantages inside the group
    mask = (out["completion_mask"] * out["tool_mask"]).tolist()
    assert sum(mask[3]) == 0  # the infrastructure fault carries zero loss weight
    assert out["num_items_in_batch"].item() == sum(sum(m) for m in mask[:3])

    # --- a micro-batch whose advantages are all 0 has a zero gradient: skipped, same (zero) gradients as TRL's loss
    from trl import GRPOTrainer

    model = trainer.model
    model.train()
    assert not trainer._zero_gradient_batch(model, out)
    batch = {k: v[2:] if torch.is_tensor(v) and v.dim() and v.shape[0] == G else v for k, v in out.items()}
    batch["advantages"] = torch.zeros(2)
    assert trainer._zero_gradient_batch(model, batch)
    grads = []
    for compute in (lambda: GRPOTrainer.compute_loss(trainer, model, batch), lambda: trainer.compute_loss(model, batch)):
        model.zero_grad(set_to_none=True)
        compute().backward()
        grads.append([p.grad for p in model.parameters() if p.requires_grad])
    assert all(g is not None and not g.any() for gs in grads for g in gs) and len(grads[0]) == len(grads[1]) > 0
    model.zero_grad(set_to_none=True)

    # --- no loss on observation tokens: the masked tokens are exactly the template's observation tokens
    policy = trainer.rollout_policy
    for i in range(3):
        ids = [t for t, m in zip(out["completion_ids"][i].tolist(), out["completion_mask"][i].tolist()) if m]
        m = [x for x, c in zip(out["tool_mask"][i].tolist(), out["completion_mask"][i].tolist()) if c]
        traj = rows[i]["trajectory"]
        steps = traj["steps"][traj["prefix_len"] :]
        assert [s["action"]["tool"] for s in steps] == ["bash", "submit"]
        generated = [t for t, k in zip(ids, m) if k]
        masked = [t for t, k in zip(ids, m) if not k]
        assert generated == steps[0]["extra"]["completion_token_ids"] + steps[1]["extra"]["completion_token_ids"]
        tool_msg = {"role": "tool", "name": "bash", "tool_call_id": "call_0", "content": steps[0]["observation"]}
        assert masked == policy.observation_ids([tool_msg], after_tool_call=True)
        assert COMMANDS[i] in tok.decode(generated) and steps[0]["observation"] not in tok.decode(generated)

    # --- step 2: the online failure state of attempt 2 (premature submit after `echo nope`), rebuilt from
    # its parent's snapshot plus one command, forked G times
    rows2 = [json.loads(line) for line in rounds[1].read_text().splitlines()]
    assert {r["state_source"] for r in rows2} == {"online"} and len({r["state_id"] for r in rows2}) == 1
    online = pool.get(rows2[0]["state_id"])
    assert online.parent_id == seed.state_id and online.category == "premature_completion"
    assert online.replay_commands == seed.replay_commands + ["echo nope"]
    assert len({r["environment_id"] for r in rows2}) == G and all(r["dropped"] is None for r in rows2)
    assert [r["reward"] for r in rows2] == [1.0, 1.0, 0.0, None]
    logged = [e for e in trainer.state.log_history if "reterm/reward_mean" in e]
    assert [e["reterm/recovery_rate/path_permission"] for e in logged[:1]] == [pytest.approx(2 / 3)]
    assert logged[1]["reterm/recovery_rate/premature_completion"] == pytest.approx(2 / 3)
    assert logged[0]["reterm/infra_fault_share"] == pytest.approx(0.25)

    # --- nothing left behind; the checkpoint runs in the harness
    after = _leftovers(TASK)
    assert after == {"boxes": before["boxes"], "runs": [], "mounts": [], "snapshots": []}, after
    trainer.save_model(str(tmp_path / "ckpt"))
    harness = load_policy(f"hf:{tmp_path / 'ckpt'}", max_new_tokens=4, enable_thinking=False)
    (gen,) = harness.generate([seed.prompt], [])
    assert gen.completion_tokens and gen.completion_tokens <= 4
