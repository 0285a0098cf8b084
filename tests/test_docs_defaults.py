"""The defaults the docs quote are the code's: tokens a turn, the embedded default's sizes (drills per family, SFT
steps, GRPO steps, groups per step and G, evaluated instances) and the stage list.

Every value is read from the code (``reterm/generation.py``, the *sizes* block and ``STAGES`` of
``train/run_all.sh``, the recipe YAMLs), never written here, so a change of a default fails this test until the
prose says the same. Each phrasing checked must occur at least once where it is expected, so that rewording a
sentence out of the checked form fails too instead of silently escaping the check.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
RUN_ALL = (REPO / "train" / "run_all.sh").read_text()
RECIPES = REPO / "train" / "recipes" / "smollm2-135m"
DOCS = {name: (REPO / name).read_text() for name in ("README.md", "docs/REPRODUCING.md", "docs/ARCHITECTURE.md",
                                                      "train/README.md")}  # fmt: skip
WORDS = {"one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "eight": 8}


def _int(word: str) -> int:
    return int(word) if word.isdigit() else WORDS[word.lower()]


def stages() -> list[str]:
    """run_all.sh's ``STAGES=(...)``."""
    (body,) = re.findall(r"^STAGES=\(([^)]*)\)", RUN_ALL, re.M)
    return body.split()


def default_sizes() -> dict[str, dict[str, str]]:
    """The ``smollm2-135m:default`` case of run_all.sh's sizes block: array name -> {flag: value}."""
    (block,) = re.findall(r"^  smollm2-135m:default\)\n(.*?)^    ;;", RUN_ALL, re.M | re.S)
    out: dict[str, dict[str, str]] = {}
    for name, body in re.findall(r"^\s*(\w+_SIZE)=\(([^)]*)\)", block, re.M | re.S):
        words = shlex.split(body, comments=True)
        out[name] = {w: (words[i + 1] if i + 1 < len(words) and not words[i + 1].startswith("--") else "")
                     for i, w in enumerate(words) if w.startswith("--")}  # fmt: skip
    return out


def grpo_budget(recipe: str = "grpo.yaml", overrides: dict[str, str] | None = None) -> tuple[int, int, int]:
    """(optimiser steps, groups per step, G) of a GRPO recipe with run_all's command-line overrides: a step takes
    ``per_device_train_batch_size x gradient_accumulation_steps`` attempts on one process, G of them a group."""
    params = {**yaml.safe_load((RECIPES / recipe).read_text()),
              **{k[2:]: yaml.safe_load(v) for k, v in (overrides or {}).items()}}  # fmt: skip
    g = int(params["num_generations"])
    attempts = int(params["per_device_train_batch_size"]) * int(params["gradient_accumulation_steps"])
    assert attempts % g == 0, f"{recipe}: {attempts} attempts a step are not whole groups of {g}"
    return int(params["max_steps"]), attempts // g, g


def _matches(pattern: str, names: list[str] | None = None, need: list[str] | None = None) -> list[tuple[str, tuple]]:
    """``(document, groups)`` of every match of ``pattern`` in ``names`` (default all docs), line breaks read as
    spaces; each document of ``need`` must have at least one match."""
    found = [(n, m.groups()) for n in (names or list(DOCS)) for m in re.finditer(pattern, " ".join(DOCS[n].split()))]
    for n in need or []:
        assert any(d == n for d, _ in found), f"{n}: no sentence of the form {pattern!r} (reworded? keep it checkable)"
    return found


def test_tokens_a_turn_is_generation_py_s():
    from reterm.generation import MAX_TURN_TOKENS

    for doc, (n,) in _matches(r"`MAX_TURN_TOKENS` \((\d+)\)", need=["README.md"]):
        assert int(n) == MAX_TURN_TOKENS, f"{doc} says MAX_TURN_TOKENS is {n}; reterm/generation.py: {MAX_TURN_TOKENS}"


def test_grpo_steps_groups_and_g_are_run_all_s():
    steps, groups, g = grpo_budget("grpo.yaml", default_sizes()["GRPO_SIZE"])
    assert grpo_budget("grpo_standard.yaml", default_sizes()["GRPO_SIZE"]) == (steps, groups, g)  # equal budgets
    pattern = r"(\d+) GRPO steps of (\w+) groups? of G ?= ?(\d+)"
    for doc, (s, k, gg) in _matches(pattern, need=["README.md", "docs/REPRODUCING.md"]):
        assert (int(s), _int(k), int(gg)) == (steps, groups, g), (
            f"{doc}: '{s} GRPO steps of {k} groups of G = {gg}'; run_all.sh and the recipe: {steps} steps of "
            f"{groups} groups of G = {g}")
    for doc, (s,) in _matches(r"train/grpo\.py[^`|\n]*--max_steps (\d+)"):
        assert int(s) == steps, f"{doc}: a train/grpo.py command with --max_steps {s}; run_all.sh passes {steps}"
    # the run_all.sh comment of the sizes block
    (comment,) = re.findall(r"(\d+) GRPO steps of (\w+) groups of G=(\d+)", RUN_ALL)
    assert (int(comment[0]), _int(comment[1]), int(comment[2])) == (steps, groups, g), comment


@pytest.mark.parametrize("recipe", ["grpo.yaml", "grpo_standard.yaml"])
def test_recipe_comments_say_the_recipe_s_own_budget(recipe):
    text = (RECIPES / recipe).read_text()
    steps, groups, g = grpo_budget(recipe)
    comments = [line.split("#", 1)[1] for line in text.splitlines() if "#" in line]
    budget = [m.groups() for c in comments for m in re.finditer(r"(\d+) steps x (\d+) groups x G=(\d+)", c)]
    assert budget and all((int(s), int(k), int(gg)) == (steps, groups, g) for s, k, gg in budget), budget
    for c in comments:  # any other "N steps" in a comment is this recipe's max_steps
        for n in re.findall(r"\b(\d+) (?:ReTerm-GRPO )?steps\b", c):
            assert int(n) == steps, f"{recipe}: a comment says {n} steps; max_steps is {steps}: {c.strip()!r}"


def test_sft_recipe_comment_names_the_dataset_it_reads():
    text = (RECIPES / "sft.yaml").read_text()
    assert "smoke dataset" not in text and yaml.safe_load(text)["dataset_name"].endswith("/data")


def test_sizes_of_the_embedded_default_are_run_all_s():
    sizes = default_sizes()
    per_family = int(sizes["DRILL_SIZE"]["--per-family"])
    sft_steps = sizes["SFT_SIZE"].get("--max_steps")  # None: the recipe's epochs
    recipe_epochs = yaml.safe_load((RECIPES / "sft.yaml").read_text())["num_train_epochs"]
    sft_epochs = int(sizes["SFT_SIZE"].get("--num_train_epochs", recipe_epochs))
    ev = sizes["EVAL_SIZE"]
    max_id, max_ood, max_states = int(ev["--max-id"]), int(ev["--max-ood"]), int(ev["--max-states"])
    for doc, groups in _matches(r"(\d+) drills per family", need=["README.md"]) + \
            _matches(r"families x (\d+) instances", need=["docs/REPRODUCING.md"]) + \
            _matches(r"(\d+) instances per drill family"):
        assert int(groups[0]) == per_family, f"{doc}: {groups[0]} per family; run_all.sh: --per-family {per_family}"
    if sft_steps is not None:
        for doc, (n,) in _matches(r"SFT (?:for )?(\d+) (?:optimiser )?steps", need=["README.md", "docs/REPRODUCING.md"]):
            assert int(n) == int(sft_steps), f"{doc}: SFT {n} steps; run_all.sh: --max_steps {sft_steps}"
    else:
        assert not _matches(r"SFT (?:for )?(\d+) (?:optimiser )?steps"), "the docs quote SFT steps; run_all.sh sets none"
        own = "--num_train_epochs" in sizes["SFT_SIZE"]  # run_all.sh cuts the recipe's epochs
        for doc, (n,) in _matches(r"SFT for (\w+) epochs?\b", need=["README.md", "docs/REPRODUCING.md"] if own else None):
            assert _int(n) == sft_epochs, f"{doc}: SFT for {n} epochs; run_all.sh / sft.yaml: {sft_epochs}"
        recipe_need = None if own else ["README.md", "docs/REPRODUCING.md"]
        for doc, (n,) in _matches(r"SFT for the recipe's (\w+) epochs", need=recipe_need):
            assert not own and _int(n) == recipe_epochs, f"{doc}: SFT for the recipe's {n} epochs; sft.yaml: {recipe_epochs}"
    for doc, (n,) in _matches(r"train/sft\.py[^`|\n]*--max_steps (\d+)"):
        assert sft_steps is not None and int(n) == int(sft_steps), \
            f"{doc}: a train/sft.py command with --max_steps {n}; run_all.sh: {sft_steps}"
    for doc, (a, b) in _matches(r"(\d+) \+ (\d+) evaluated instances", need=["README.md"]) + \
            _matches(r"Pass@1 on (\d+) in-distribution and (\d+) out-of-distribution", need=["docs/REPRODUCING.md"]):
        assert (int(a), int(b)) == (max_id, max_ood), f"{doc}: {a} + {b} evaluated; run_all.sh: {max_id} + {max_ood}"
    injected = _matches(r"Recovery@1 from (\d+) \+ \d+ injected failure states",
                        need=["docs/REPRODUCING.md"] if max_states else None)  # fmt: skip
    for doc, (a,) in injected:
        assert int(a) == max_states, f"{doc}: Recovery@1 from {a} states; run_all.sh: --max-states {max_states}"
    multistage = int(ev["--multistage-states"])
    for doc, (a,) in _matches(r"Recovery@1 from (\d+) own two-stage failure states",
                              need=["README.md", "docs/REPRODUCING.md"]):
        assert int(a) == multistage, f"{doc}: Recovery@1 from {a} states; run_all.sh: --multistage-states {multistage}"


def test_stage_lists_are_run_all_s():
    want = stages()
    # run_all.sh's own header
    (header,) = re.findall(r"^# Stages, in order.*?\n(.*?)^# Resuming", RUN_ALL, re.M | re.S)
    assert re.findall(r"^#   ([a-z-]+) ", header, re.M) == want, "train/run_all.sh header"
    # README: the list after `--from eval`
    (listed,) = re.findall(r"re-run from a stage on \(([a-z -]+)\)", DOCS["README.md"])
    assert listed.split() == want, "README.md: the stages after --from"
    # docs/ARCHITECTURE.md: the chain `setup → drills → ... → summary`
    (chain,) = re.findall(r"^setup → .*?\s→ summary", DOCS["docs/ARCHITECTURE.md"], re.M | re.S)
    names = []
    for segment in chain.split("→"):
        lead = re.sub(r"\(.*", "", " ".join(segment.split()), flags=re.S).strip()
        names += [n.strip() for n in lead.split(" and ")]
    assert names == want, "docs/ARCHITECTURE.md: the stage chain"
    # docs/REPRODUCING.md: the stage table
    (table,) = re.findall(r"^\| stage \| what it does \|.*?\n\|[-|]+\n(.*?)\n\n", DOCS["docs/REPRODUCING.md"], re.M | re.S)
    assert re.findall(r"^\| ([a-z-]+) \|", table, re.M) == want, "docs/REPRODUCING.md: the stage table"
    # README's run-folder tree has a line for the folder of each stage that writes one under RUN
    tree = DOCS["README.md"].split("```\nruns/smollm2-135m/\n", 1)[1].split("```", 1)[0]
    for folder in re.findall(r'stage [a-z-]+ "\$RUN/([a-z-]+)"', RUN_ALL) + ["data-mined"]:
        assert re.search(rf"^  {folder}/", tree, re.M), f"README.md: the run-folder tree lacks {folder}/"


def test_no_budget_is_claimed_for_the_default_in_minutes_without_a_run():
    # the default's time is measured by a run (README "Measured", train/measured.py), not promised in prose
    help_text = re.findall(r"--size NAME\s+(.*)", RUN_ALL)
    assert help_text and not re.search(r"\d+ ?min|an hour", help_text[0]), help_text
    assert not re.search(r"sized for about an hour|at most 90 minutes", RUN_ALL + DOCS["docs/REPRODUCING.md"])
