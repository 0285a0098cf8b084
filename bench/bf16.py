"""Benchmark: bf16 against fp32 on this CPU, for SFT and for generation, in one run (issue 30).

- **SFT**: the embedded SmolLM2-135M with the SFT recipe's LoRA (``train/recipes/smollm2-135m/sft.yaml``: r, alpha,
  all-linear), one sequence of ``--tokens`` tokens a step, forward + backward + AdamW, loss on every token;
  fp32 against bf16 autocast (what ``bf16: true`` gives a CPU run through accelerate: fp32 master weights, LoRA
  and optimiser state). ``--steps`` timed steps after one warm-up step; the best step counts.
- **generation**: the kit's prompt (system prompt, tools, a drill instruction), ``--batch`` conversations,
  ``--new-tokens`` greedy tokens each, with fp32 weights against bf16 weights (what
  :class:`reterm.policies.transformers_policy.TransformersPolicy` loads under ``dtype="auto"`` on a CPU with
  AMX / AVX-512 BF16, :mod:`reterm.precision`).

Prints a markdown table (tokens/s and the ratio) and one JSON line. The machine's other load changes both sides;
run it on a quiet machine, or compare the ratio only.

Usage: ``python bench/bf16.py [--tokens 768] [--steps 3] [--batch 8] [--new-tokens 32]``
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def sft_tokens_per_s(path: str, bf16: bool, tokens: int, steps: int) -> float:
    import torch
    import yaml
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    recipe = yaml.safe_load((REPO / "train/recipes/smollm2-135m/sft.yaml").read_text())
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    model = get_peft_model(model, LoraConfig(r=recipe["lora_r"], lora_alpha=recipe["lora_alpha"],
                                             lora_dropout=recipe["lora_dropout"],
                                             target_modules=recipe["lora_target_modules"]))  # fmt: skip
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-5)
    x = torch.randint(0, model.config.vocab_size, (1, tokens))
    best = float("inf")
    for i in range(steps + 1):
        t = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            loss = model(input_ids=x, labels=x).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
        if i:
            best = min(best, time.perf_counter() - t)
    return tokens / best


def generation_tokens_per_s(path: str, bf16: bool, batch: int, new_tokens: int) -> tuple[float, int]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from reterm.agent.protocol import TOOLS, initial_messages

    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16 if bf16 else torch.float32)
    msgs = initial_messages("Count the lines of /data/quartz.csv and write the number to /root/count.txt.", TOOLS)
    ids = tok.apply_chat_template(msgs, tools=TOOLS, add_generation_prompt=True, return_tensors="pt",
                                  return_dict=True)["input_ids"].repeat(batch, 1)  # fmt: skip
    with torch.no_grad():
        model.generate(ids[:1], max_new_tokens=2, do_sample=False)  # warm-up
        t = time.perf_counter()
        model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens,
                       min_new_tokens=new_tokens, do_sample=False)  # fmt: skip
    return batch * new_tokens / (time.perf_counter() - t), ids.shape[1]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tokens", type=int, default=768, help="tokens per SFT step")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--new-tokens", type=int, default=32)
    a = p.parse_args(argv)
    sys.path.insert(0, str(REPO))
    from reterm.policies.smollm2 import embedded_model_path
    from reterm.precision import cpu_bf16_fast

    path = str(embedded_model_path())
    if not cpu_bf16_fast():
        print("note: this CPU has no bf16 matrix instructions; the kit keeps fp32 here (expect bf16 to be slower)")
    sft = {b: sft_tokens_per_s(path, b, a.tokens, a.steps) for b in (False, True)}
    gen = {}
    for b in (False, True):
        gen[b], prompt = generation_tokens_per_s(path, b, a.batch, a.new_tokens)
    print(f"| SmolLM2-135M, {os.cpu_count()} CPUs | fp32 tokens/s | bf16 tokens/s | bf16 / fp32 |")
    print("|---|---|---|---|")
    print(f"| SFT step (LoRA, {a.tokens} tokens, forward+backward+AdamW) | {sft[False]:.0f} | {sft[True]:.0f} | "
          f"{sft[True] / sft[False]:.2f} |")  # fmt: skip
    print(f"| generation (batch {a.batch}, {prompt}-token prompt, {a.new_tokens} new tokens) | {gen[False]:.1f} | "
          f"{gen[True]:.1f} | {gen[True] / gen[False]:.2f} |")  # fmt: skip
    print(json.dumps({"sft_fp32": sft[False], "sft_bf16": sft[True], "gen_fp32": gen[False], "gen_bf16": gen[True],
                      "cpu_bf16_fast": cpu_bf16_fast()}))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
