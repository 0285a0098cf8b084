"""The GRPO rollout policy keeps exact token ids per conversation: generated tokens carry loss, the
template-rendered observation tokens do not, and nothing is re-tokenised (reterm.training.grpo_policy).

The conversations here go through the harness's own parser and message layout
(``parse_action``, ``Trajectory.to_messages``) without sandboxes; tests/test_grpo_trainer.py runs the
same policy in real forks."""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer

from reterm.agent.protocol import TOOLS, initial_messages, parse_action
from reterm.policies.base import FINISH_CONTEXT_LENGTH
from reterm.policies.scripted import bash_call, submit_call
from reterm.policies.transformers_policy import template_messages
from reterm.training.grpo_policy import TokenTrajectoryPolicy, scripted_generate_fn
from reterm.training.likelihood import training_chat_template
from reterm.training.models import resolve_model_name_or_path
from reterm.trajectory import Step, Trajectory

INSTRUCTION = "Create /app/hello.txt holding `Hello, world!`."


@pytest.fixture(scope="module", params=["smollm2", "tiny-qwen3.5"])
def tok(request):
    return AutoTokenizer.from_pretrained(resolve_model_name_or_path(request.param))


def _kwargs(tok):
    return {"enable_thinking": False} if "<function=" in (tok.chat_template or "") else {}


def _policy(tok, reply, **kw):
    return TokenTrajectoryPolicy(tok, scripted_generate_fn(tok, reply), chat_template=training_chat_template(tok),
                                 chat_template_kwargs=_kwargs(tok), **kw)  # fmt: skip


def _episodes(policy, n, turns, observe):
    """A sandbox-free stand-in for run_episodes: same parser, same Step/extra fields, same messages."""
    trajs = [Trajectory(task_id="t", instruction=INSTRUCTION, system_prompt=initial_messages("")[0]["content"])
             for _ in range(n)]  # fmt: skip
    live = list(range(n))
    for turn in range(turns):
        if not live:
            break
        gens = policy.generate([trajs[i].to_messages() for i in live], TOOLS)
        still = []
        for i, g in zip(live, gens):
            if g.finish_reason == FINISH_CONTEXT_LENGTH:
                continue
            parsed = parse_action(g.text, policy.call_format)
            step = Step(index=len(trajs[i].steps), model_text=g.text, reasoning=parsed.message_content or None,
                        action=parsed.action, parse_error=None if parsed.ok else parsed.outcome,
                        extra={"completion_token_ids": list(g.token_ids)})  # fmt: skip
            if parsed.action is None:
                step.observation = parsed.observation()
            elif parsed.action.tool == "bash":
                step.observation = observe(i, turn, parsed.action.command)
            trajs[i].steps.append(step)
            if parsed.action is None or parsed.action.tool != "submit":
                still.append(i)
        live = still
    return trajs


def _split(tok, t):
    gen = [x for x, m in zip(t.completion_ids, t.env_mask) if m]
    obs = [x for x, m in zip(t.completion_ids, t.env_mask) if not m]
    return tok.decode(gen), tok.decode(obs)


def test_generated_and_observation_tokens_are_exact_and_masked(tok):
    fmt = "qwen" if "<function=" in (tok.chat_template or "") else "hermes"
    commands = {0: ["ls /app", "printf 'Hello, world!\\n' > /app/hello.txt"], 1: ["cat /app/x", "echo hi"]}

    def reply(chain_id, messages):
        k = sum(m["role"] == "assistant" for m in messages)
        if chain_id == 2 and k == 0:
            return "I will just think about it."  # no tool call: a parse error, answered by a user message
        script = commands.get(chain_id, ["pwd"])
        return bash_call(script[k], call_format=fmt) if k < len(script) else submit_call(fmt)

    policy = _policy(tok, reply)
    observe = lambda i, turn, cmd: f"output of `{cmd}` in episode {i}\n[exit status: {turn}]"  # noqa: E731
    trajs = _episodes(policy, 3, 4, observe)
    tokens = policy.tokens_for(trajs)
    for i, (traj, t) in enumerate(zip(trajs, tokens)):
        assert t.exact and len(t.completion_ids) == len(t.env_mask)
        assert t.prompt_ids == policy.prompt_ids(initial_messages(INSTRUCTION))
        gen_text, obs_text = _split(tok, t)
        # the loss-carrying tokens are exactly the generated ones, turn after turn
        generated = [x for s in traj.steps for x in s.extra["completion_token_ids"]]
        assert [x for x, m in zip(t.completion_ids, t.env_mask) if m] == generated
        for s in traj.steps:
            assert s.model_text in gen_text
            if s.observation:
                assert s.observation not in gen_text and s.observation in obs_text
        # observation tokens are the template's rendering of the observation messages
        assert "<|im_start|>user" in obs_text and "<|im_start|>assistant" in obs_text
        assert t.completion_ids[-1] == tok.eos_token_id and t.env_mask[-1] == 1
    # the parse-error episode's correction came back as a user message, without loss
    parse_err = trajs[2].steps[0]
    assert parse_err.parse_error == "no_tool_call" and parse_err.observation in _split(tok, tokens[2])[1]
    assert "<tool_response>" not in _split(tok, tokens[2])[1].split(parse_err.observation)[0][-40:]
    # prompt + completion is the chat template's own rendering of the whole conversation (the harness's
    # view): no re-tokenisation drift between what was sampled and what is trained on
    for traj, t in zip(trajs[:2], tokens[:2]):
        full = tok.apply_chat_template(template_messages(traj.to_messages()), tools=TOOLS, chat_template=training_chat_template(tok),
                                       tokenize=True, return_dict=False, **_kwargs(tok))  # fmt: skip
        ours = t.prompt_ids + t.completion_ids
        assert full[: len(ours)] == ours and tok.decode(full[len(ours):]).strip() == ""


def test_identical_forks_get_separate_chains_and_budgets_hold(tok):
    fmt = "qwen" if "<function=" in (tok.chat_template or "") else "hermes"
    long = "echo " + "x" * 400
    policy = _policy(tok, lambda cid, m: bash_call(long if cid == 3 else "true", call_format=fmt),
                     max_turn_tokens=40, max_completion_tokens=200)  # fmt: skip
    trajs = _episodes(policy, 4, 10, lambda i, turn, cmd: "[exit status: 0]")
    tokens = policy.tokens_for(trajs)
    assert len({id(t) for t in tokens}) == 4 and all(t.exact for t in tokens)
    for traj, t in zip(trajs, tokens):
        assert len(t.completion_ids) <= 200  # the attempt's budget, observations included
        assert all(len(s.extra["completion_token_ids"]) <= 40 for s in traj.steps)  # the turn's budget
        assert t.env_mask[-1] == 1  # no trailing observation without a generation after it
    # episode 3's turns were cut at 40 tokens: each got the end-of-turn token appended without loss
    cut = tokens[3]
    eos_positions = [k for k, x in enumerate(cut.completion_ids) if x == tok.eos_token_id]
    assert eos_positions and all(cut.env_mask[k] == 0 for k in eos_positions)
    assert all(s.extra.get("completion_token_ids")[-1] != tok.eos_token_id for s in trajs[3].steps)


def test_a_template_that_is_not_prefix_preserving_is_refused():
    tok = AutoTokenizer.from_pretrained(resolve_model_name_or_path("tiny-qwen3.5"))
    # Qwen3.5's inference template drops earlier reasoning once a user message follows (parse errors)
    with pytest.raises(ValueError, match="prefix-preserving"):
        TokenTrajectoryPolicy(tok, scripted_generate_fn(tok, lambda c, m: ""), chat_template_kwargs={"enable_thinking": False})
