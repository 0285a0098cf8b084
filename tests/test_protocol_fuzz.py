"""Fuzz test of the action parser: generated malformed model outputs never raise and always map to a
defined outcome. Seeded generator, no extra dependency."""

from __future__ import annotations

import json
import random

from reterm.agent.protocol import MAX_TEXT_CHARS, OK_OUTCOMES, PARSE_OUTCOMES, format_tool_call, parse_action

N_CASES = 600
SEED = 20261001

_FRAGMENTS = [
    "<tool_call>", "</tool_call>", "<think>", "</think>", "<function=bash>", "<function=", "</function>",
    "<parameter=command>", "</parameter>", "<parameter=timeout>", '{"name": "bash"', '"arguments": {',
    '"command": "ls"', "}", "{", "[", "]", '"', "\\", "\n", "\t", "<|im_end|>", "<|im_start|>assistant\n",
    "null", "true", "1e999", "NaN", '"timeout": -5', '"timeout": "x"', "submit", "python", "```json\n",
    "```", "\u200b", "é", "漢字", "\x1b[31m",
]  # fmt: skip


def _valid(rng: random.Random) -> str:
    fmt = rng.choice(["hermes", "qwen"])
    if rng.random() < 0.2:
        return format_tool_call("submit", {}, fmt)
    args = {"command": rng.choice(["ls -la", "cat /etc/os-release", "python3 -c 'print(1)'", "echo \"a\\nb\""])}
    if rng.random() < 0.3:
        args["timeout"] = rng.choice([5, 30.5, "10"])
    return format_tool_call("bash", args, fmt)


def _mutate(text: str, rng: random.Random) -> str:
    kind = rng.randrange(12)
    if kind == 0:  # truncate anywhere (ran out of tokens)
        return text[: rng.randrange(len(text) + 1)]
    if kind == 1:  # delete a span
        i = rng.randrange(len(text) + 1)
        return text[:i] + text[i + rng.randint(1, 12) :]
    if kind == 2:  # insert random fragments
        for _ in range(rng.randint(1, 4)):
            i = rng.randrange(len(text) + 1)
            text = text[:i] + rng.choice(_FRAGMENTS) + text[i:]
        return text
    if kind == 3:  # several calls, some broken
        return "\n".join(_mutate(_valid(rng), rng) if rng.random() < 0.5 else _valid(rng) for _ in range(rng.randint(2, 4)))
    if kind == 4:  # binary / control bytes
        i = rng.randrange(len(text) + 1)
        return text[:i] + "".join(chr(rng.randrange(0, 32)) for _ in range(rng.randint(1, 5))) + text[i:]
    if kind == 5:  # undecodable bytes decoded with replacement
        raw = text.encode() + bytes(rng.randrange(128, 256) for _ in range(rng.randint(1, 20)))
        return raw.decode("utf-8", errors="replace")
    if kind == 6:  # huge blob
        return text + rng.choice(["A", "ab\n", "{"]) * (MAX_TEXT_CHARS // 2 + rng.randrange(MAX_TEXT_CHARS))
    if kind == 7:  # prose around or instead of the call
        return rng.choice(["Sure! ", "I'll run:\n", "```bash\nls\n```\n", ""]) + rng.choice([text, "Let me think."])
    if kind == 8:  # corrupt JSON structure
        body = text.replace('"', rng.choice(["'", "", '""']), rng.randint(1, 3))
        return body
    if kind == 9:  # wrong names / argument types
        return json.dumps({"name": rng.choice(["bash", "Bash", "shell", "", None, 3]),
                           "arguments": rng.choice([{}, {"command": 5}, {"cmd": "ls"}, "ls", None, []])}).join(
            ["<tool_call>", rng.choice(["</tool_call>", "", "</tool_call"])])  # fmt: skip
    if kind == 10:  # think block damage
        return rng.choice(["<think>", "</think>", "<think></think>", "<think>\n"]) + text[: rng.randrange(len(text) + 1)]
    return "".join(rng.choice(_FRAGMENTS) for _ in range(rng.randint(1, 30)))  # fragment soup


def test_fuzz_parser_never_raises_and_every_output_has_a_defined_outcome():
    rng = random.Random(SEED)
    seen: dict[str, int] = {}
    malformed = 0
    for i in range(N_CASES):
        text = _mutate(_valid(rng), rng)
        r = parse_action(text)  # must not raise
        assert r.outcome in PARSE_OUTCOMES, (i, r.outcome)
        seen[r.outcome] = seen.get(r.outcome, 0) + 1
        if r.ok:
            assert r.action is not None and r.action.tool in ("bash", "submit")
            assert r.action.tool != "bash" or isinstance(r.action.command, str)
        else:
            malformed += 1
            assert r.action is None and r.error
            obs = r.observation()
            assert obs.startswith(f"[parse error: {r.outcome}]") and "<tool_call>" in obs
            assert len(obs) < 2000  # never echoes a huge blob back to the model
    assert malformed >= 200, malformed
    # the (seeded) generator reaches every outcome, so the fuzz set covers all defined outcomes
    missing = set(PARSE_OUTCOMES) - set(seen)
    assert not missing, (missing, seen)
    assert set(seen) >= OK_OUTCOMES
