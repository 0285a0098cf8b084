"""The GRPO learning signal, measured through the kit's own trainer (ReTermGRPOTrainer on TRL 1.16) on real
parts: the local sandbox (snapshot and G forks of the failure state), the task's real verifier, the tiny
Qwen3.5 with LoRA computing the loss, and scripted replies whose attempts pass or fail on purpose.

Checked (issue 22, item 3):
- a group whose verifier rewards are [1, 1, 0, 0] gets non-zero advantages *derived by the trainer*, gives a
  non-zero gradient in the one optimiser step of ``trainer.train()``, changes the LoRA parameters, and raises
  the log-probability of the rewarded completions relative to the failed ones;
- a group whose rewards are [1, 1, 1, 1] gets exactly zero advantages (again derived by the trainer from the
  rewards, not set by hand), TRL's own loss on it has an exactly zero gradient, and with ``beta: 0`` the
  step leaves every parameter unchanged;
- observation tokens (``env_mask`` 0) carry no loss: the kit's mask is 0 exactly on the template's
  rendering of the observations, and TRL's loss restricted to those tokens has an exactly zero gradient
  although the advantages are non-zero.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from datasets import load_dataset
from sandbox_support import HELLO_TASK

from reterm.policies.scripted import assistant_commands, bash_call, submit_call

FIXTURES = Path(__file__).resolve().parent / "fixtures"
G = 4
TASK = "hello-signal-test"
PASS = "printf 'Hello, world!\\n' > /app/hello.txt"
# by attempt: two recoveries, two failures (a premature submit after a command that does not fix the state)
MIXED = {0: PASS, 1: PASS + " && cat /app/hello.txt", 2: "echo nope", 3: "echo still-nope"}
ALL_PASS = {0: PASS, 1: PASS + " && cat /app/hello.txt", 2: PASS + " && ls /app", 3: PASS + " && true"}


def _reply_fn(commands: dict[int, str]):
    def reply(chain_id: int, messages: list[dict]) -> str:
        mine = commands[chain_id % G]
        return submit_call("qwen") if mine in assistant_commands(messages) else bash_call(mine, call_format="qwen")

    return reply


def _seq_logps(model, out, rows) -> list[float]:
    """Sum of the log-probabilities of each attempt's *generated* tokens (completion_mask * tool_mask) under
    ``model`` (no gradient)."""
    import torch

    res = []
    with torch.no_grad():
        for i in rows:
            p = out["prompt_ids"][i][out["prompt_mask"][i].bool()]
            c = out["completion_ids"][i]
            m = (out["completion_mask"][i] * out["tool_mask"][i]).bool()
            ids = torch.cat([p, c]).unsqueeze(0)
            logits = model(input_ids=ids).logits[0, len(p) - 1 : -1].float()
            lp = torch.log_softmax(logits, -1).gather(-1, c.unsqueeze(-1)).squeeze(-1)
            res.append(float(lp[m].sum()))
    return res


def _one_step(tmp_path: Path, commands: dict[int, str]):
    """One optimiser step of ReTermGRPOTrainer (LoRA on the tiny Qwen3.5, beta 0) on one group of G attempts
    from the fixture's failure state; returns what the test inspects."""
    import torch
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, TrainerCallback

    from reterm.training.failure_pool import FailurePool, seed_states_from_records
    from reterm.training.grpo_config import ReTermGRPOConfig
    from reterm.training.grpo_policy import scripted_generate_fn
    from reterm.training.grpo_trainer import ReTermGRPOTrainer
    from reterm.training.models import load_tokenizer, resolve_model_name_or_path

    task = tmp_path / "tasks" / TASK
    shutil.copytree(HELLO_TASK, task)
    record = load_dataset(str(FIXTURES / "grpo_seed"), split="train")[0]  # hello-file: wrote to /ap/ (typo)
    (seed,), _ = seed_states_from_records([dict(record, task_id=TASK)], [task.parent])
    path = resolve_model_name_or_path("tiny-qwen3.5")
    tok = load_tokenizer(path)
    args = ReTermGRPOConfig(
        output_dir=str(tmp_path / "out"), per_device_train_batch_size=G, gradient_accumulation_steps=1,
        num_generations=G, max_steps=1, beta=0.0, max_turns=3, max_turn_tokens=64, max_completion_length=320,
        learning_rate=1e-3, use_cpu=True, bf16=False, report_to="none", logging_steps=1, save_strategy="no",
        task_dirs=[str(task.parent)], online_state_fraction=0.0, chat_template_kwargs={"enable_thinking": False},
        seed=3,
    )  # fmt: skip
    pool = FailurePool([seed], online_fraction=0.0, seed=3)
    grads: list[float] = []

    class GradProbe(TrainerCallback):
        def on_pre_optimizer_step(self, args, state, control, model=None, **kw):
            grads.append(sum(float(p.grad.abs().sum()) for p in model.parameters()
                             if p.requires_grad and p.grad is not None))  # fmt: skip

    trainer = ReTermGRPOTrainer(
        AutoModelForCausalLM.from_pretrained(path), args, pool, processing_class=tok,
        generate_fn=scripted_generate_fn(tok, _reply_fn(commands)), callbacks=[GradProbe()],
        peft_config=LoraConfig(r=8, lora_alpha=16, target_modules="all-linear", task_type="CAUSAL_LM"),
    )  # fmt: skip
    model = trainer.model
    params0 = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    assert params0 and all("lora_" in n for n in params0)
    outputs, before = [], []
    inner = trainer._generate_and_score_completions

    def spy(inputs):
        out = inner(inputs)
        outputs.append(out)
        before.append(_seq_logps(model, out, range(G)))  # the weights before the optimiser step
        return out

    trainer._generate_and_score_completions = spy
    trainer.train()
    assert len(outputs) == 1 and len(grads) == 1
    rows = [json.loads(line) for line in next((tmp_path / "out" / "rollouts").glob("round-*.jsonl")).read_text().splitlines()]
    changed = {n: float((p.detach() - params0[n]).abs().max()) for n, p in model.named_parameters() if n in params0}
    return {"trainer": trainer, "out": outputs[0], "rows": rows, "grad": grads[0], "changed": changed,
            "before": before[0], "after": _seq_logps(model, outputs[0], range(G)), "torch": torch, "tok": tok}  # fmt: skip


def _loss_grad_abs(trainer, batch) -> float:
    """Sum of |gradient| of TRL's own GRPO loss (GRPOTrainer.compute_loss, never the kit's zero shortcut) on
    ``batch`` over the trainable parameters."""
    from trl import GRPOTrainer

    model = trainer.model
    model.train()
    model.zero_grad(set_to_none=True)
    GRPOTrainer.compute_loss(trainer, model, batch).backward()
    total = sum(float(p.grad.abs().sum()) for p in model.parameters() if p.requires_grad and p.grad is not None)
    model.zero_grad(set_to_none=True)
    return total


@pytest.mark.slow
def test_mixed_group_moves_the_policy_toward_the_rewarded_attempts(tmp_path):
    r = _one_step(tmp_path, MIXED)
    out, torch = r["out"], r["torch"]
    assert [row["reward"] for row in r["rows"]] == [1.0, 1.0, 0.0, 0.0]
    adv = out["advantages"].tolist()
    assert adv[0] > 0 and adv[1] > 0 and adv[2] < 0 and adv[3] < 0, adv  # derived by TRL from the rewards
    assert adv[0] == pytest.approx(-adv[2])
    assert r["grad"] > 0, "a group with reward variance gave a zero gradient"
    assert max(r["changed"].values()) > 0, "trainer.train() changed no LoRA parameter"
    # LoRA's B matrices start at 0, so the first step moves them (A gets no gradient while B is 0)
    assert all(v > 0 for n, v in r["changed"].items() if "lora_B" in n)
    b, a = r["before"], r["after"]
    gap_before = (b[0] + b[1]) - (b[2] + b[3])
    gap_after = (a[0] + a[1]) - (a[2] + a[3])
    assert gap_after > gap_before, f"rewarded - failed log-probability fell: {gap_before:.4f} -> {gap_after:.4f}"
    assert a[0] > b[0] and a[1] > b[1], (b, a)  # each rewarded completion became more likely
    assert a[2] < b[2] and a[3] < b[3], (b, a)  # each failed one less likely

    # --- observation tokens carry no loss
    trainer, tok = r["trainer"], r["tok"]
    policy = trainer.rollout_policy
    for i in range(G):
        cm, tm = out["completion_mask"][i].tolist(), out["tool_mask"][i].tolist()
        ids = out["completion_ids"][i].tolist()
        masked = [t for t, c, k in zip(ids, cm, tm) if c and not k]
        traj = r["rows"][i]["trajectory"]
        steps = traj["steps"][traj["prefix_len"] :]
        tool_msg = {"role": "tool", "name": "bash", "tool_call_id": "call_0", "content": steps[0]["observation"]}
        assert masked and masked == policy.observation_ids([tool_msg], after_tool_call=True)
        generated = tok.decode([t for t, c, k in zip(ids, cm, tm) if c and k])
        assert MIXED[i] in generated and "<tool_response>" not in generated
    only_obs = dict(out, completion_mask=out["completion_mask"] * (1 - out["tool_mask"]))
    assert only_obs["completion_mask"].sum() > 0
    assert _loss_grad_abs(trainer, only_obs) == 0.0, "observation tokens carried loss"
    only_gen = dict(out, completion_mask=out["completion_mask"] * out["tool_mask"])
    assert _loss_grad_abs(trainer, only_gen) > 0  # the same batch's generated tokens do carry it
    assert torch.equal(out["tool_mask"] * out["completion_mask"], only_gen["completion_mask"])


@pytest.mark.slow
def test_equal_rewards_give_zero_advantages_and_no_update(tmp_path):
    r = _one_step(tmp_path, ALL_PASS)
    out = r["out"]
    assert [row["reward"] for row in r["rows"]] == [1.0] * G
    assert out["advantages"].tolist() == [0.0] * G  # exactly, from the trainer's own group normalisation
    assert r["grad"] == 0.0
    assert max(r["changed"].values()) == 0.0, "a group without reward variance changed parameters (beta 0)"
    assert r["before"] == r["after"]
    assert _loss_grad_abs(r["trainer"], out) == 0.0  # TRL's loss itself, without the kit's skip
