"""The classifier used by the pipeline: rules first, an optional LLM judge for the unsure cases.

:class:`Classifier` labels a batch of :class:`~reterm.recovery.classify.StepRecord` with the rules of
:mod:`reterm.recovery.classify`; when a :class:`LLMJudge` is given, the failures the rules label
``other`` or with a confidence below ``threshold`` are sent to the judge in one batched
``Policy.generate`` call (any :class:`reterm.policies.base.Policy`: an OpenAI-compatible endpoint, a local
model, a scripted test policy). The judge may answer a failure category or ``none``; it never overrides
``infra`` or the steps the rules are sure of. Its answer is parsed robustly
(:func:`parse_judge_answer`); an unparseable answer, a wrong-length batch or any exception from the
policy (``EndpointError`` included) falls back to the rules' label, so classification never raises.
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass, replace
from typing import Any

from reterm.recovery.classify import Classification, StepRecord, classify_step
from reterm.recovery.taxonomy import DEFINITIONS, FAILURE_CATEGORIES, Category, parse_category

log = logging.getLogger(__name__)

# What the judge may answer: a failure category, or "none" (the step is not a failure after all).
JUDGE_LABELS: tuple[Category, ...] = (*FAILURE_CATEGORIES, Category.NONE)

JUDGE_SYSTEM_PROMPT = (
    "You classify one step of a terminal agent (a bash command, its output and exit status) into an error "
    "category. Categories:\n"
    + "\n".join(f"- {c.value}: {DEFINITIONS[c]}" for c in JUDGE_LABELS)
    + "\n\nPick the category of the root cause the agent must fix next. Answer with one line of JSON: "
    '{"category": "<id>"} using one of the ids above, and nothing else.'
)


def _clip(text: str, limit: int) -> str:
    """Head and tail of ``text`` within about ``limit`` characters (errors are often at the end)."""
    if len(text) <= limit:
        return text
    half = limit // 2
    return f"{text[:half]}\n[... {len(text) - 2 * half} characters omitted ...]\n{text[-half:]}"


def judge_messages(record: StepRecord, rules: Classification, max_output_chars: int = 3000) -> list[dict[str, Any]]:
    """The chat messages sent to the judge for one step: system (taxonomy) + user (the step)."""
    previous = "\n".join(f"$ {c}" for c in record.previous_commands[-5:]) or "(none)"
    user = (
        f"Earlier commands (last 5):\n{previous}\n\n"
        f"Files the agent wrote earlier: {', '.join(record.agent_files[-10:]) or '(none)'}\n\n"
        f"Command:\n$ {record.command or '(' + record.tool + ')'}\n\n"
        f"Exit status: {record.exit_status if record.exit_status is not None else 'unknown'}"
        f"{' (timed out)' if record.timed_out else ''}\n\n"
        f"Output:\n{_clip(record.output or '(no output)', max_output_chars)}\n\n"
        f"A rule-based classifier guessed: {rules.label.value} ({rules.rule}). Give your category."
    )
    return [{"role": "system", "content": JUDGE_SYSTEM_PROMPT}, {"role": "user", "content": user}]


_THINK = re.compile(r"<think>.*?(</think>|$)", re.S)
_ID_WORDS = {c.value: c for c in JUDGE_LABELS}
_ID_PATTERN = re.compile(
    r"\b(" + "|".join(re.escape(c.value).replace("_", "[ _-]") for c in JUDGE_LABELS) + r")\b", re.I
)


def parse_judge_answer(text: str | None) -> Category | None:
    """The category in a judge's answer, or ``None`` when it names none.

    Tried in order: a JSON object with ``category`` (or ``label``); ``category: <id>``; the last
    category id mentioned in the text (``missing dependency`` and ``missing-dependency`` count).
    ``<think>...</think>`` blocks are ignored. ``infra`` and unknown words give ``None``. Never raises.
    """
    if not text or not isinstance(text, str):
        return None
    body = _THINK.sub("", text)
    for m in re.finditer(r"\{[^{}]*\}", body):
        try:
            obj = json.loads(m.group(0))
        except (json.JSONDecodeError, ValueError):
            continue
        if isinstance(obj, dict):
            value = obj.get("category", obj.get("label"))
            if isinstance(value, str):
                try:
                    cat = parse_category(value)
                except ValueError:
                    continue
                if cat in JUDGE_LABELS:
                    return cat
    m = re.search(r"category\W{0,5}([A-Za-z_ -]{3,40})", body, re.I)
    if m:
        found = _ID_PATTERN.match(m.group(1).strip())
        if found:
            return parse_category(found.group(1))
    mentions = _ID_PATTERN.findall(body)
    if mentions:
        return parse_category(mentions[-1])
    return None


@dataclass
class LLMJudge:
    """An LLM that labels the steps the rules are unsure of.

    Args:
        policy: any :class:`reterm.policies.base.Policy` (``generate(batch, tools)``).
        threshold: rules' confidence below which a failure is sent to the judge (``other`` always is).
        max_output_chars: the step output shown to the judge is clipped to this (head + tail).
    """

    policy: Any
    threshold: float = 0.6
    max_output_chars: int = 3000

    def wants(self, result: Classification) -> bool:
        """Whether the judge should look at a step the rules labelled ``result``."""
        if not result.label.is_failure:
            return False
        return result.label is Category.OTHER or result.confidence < self.threshold

    def judge(self, items: list[tuple[StepRecord, Classification]]) -> list[Classification]:
        """Ask the judge about ``items`` (record, rules' result) in one batch; returns one
        :class:`Classification` per item (the rules' result where the judge failed). Never raises."""
        if not items:
            return []
        batch = [judge_messages(rec, res, self.max_output_chars) for rec, res in items]
        try:
            generations = self.policy.generate(batch, [])
            texts = [getattr(g, "text", g) for g in generations]
            if len(texts) != len(items):
                raise ValueError(f"judge returned {len(texts)} answers for {len(items)} steps")
        except Exception as exc:  # EndpointError, bad backend output...: fall back to the rules
            log.warning("LLM judge failed (%s); keeping the rules' labels", exc)
            return [replace(res, rule=f"{res.rule}; judge_failed") for _, res in items]
        out = []
        for (_, res), text in zip(items, texts):
            cat = parse_judge_answer(text if isinstance(text, str) else None)
            if cat is None:
                out.append(replace(res, rule=f"{res.rule}; judge_unparsed"))
            else:
                out.append(Classification(cat, 0.7, f"judge({getattr(self.policy, 'name', 'policy')})",
                                          res.evidence, source="judge", rules_label=res.label))
        return out


@dataclass
class Classifier:
    """Rules first, then the optional :class:`LLMJudge` for ``other`` and low-confidence failures.

    ``Classifier().classify(records)`` is the rules alone. ``Classifier(judge=LLMJudge(policy))`` asks
    the judge once per call, batching every unsure step.
    """

    judge: LLMJudge | None = None

    def classify(self, records: list[StepRecord], ask: list[bool] | None = None) -> list[Classification]:
        """One :class:`Classification` per record, in order. Never raises.

        ``ask`` (same length as ``records``) limits the judge to the records marked True.
        """
        results = [classify_step(r) for r in records]
        if self.judge is None:
            return results
        ask = [i for i, res in enumerate(results) if (ask is None or ask[i]) and self.judge.wants(res)]
        for i, res in zip(ask, self.judge.judge([(records[i], results[i]) for i in ask])):
            results[i] = res
        return results
