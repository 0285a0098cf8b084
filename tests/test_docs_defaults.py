"""The defaults the docs quote are the code's: tokens a turn, the embedded default's sizes (drills per family, SFT
steps, GRPO steps, groups per step and G, evaluated instances), the stage list, GRPO's seed sources, the mechanism's
sampling temperature, the token caps in the model card and the README's 9B commands; and the README stays a front
page: the set-up command named, at most 250 lines, its results table the generated one's figures, no issue numbers
or internal words in any doc, Harbor's ``jobs/`` ignored.

Every value is read from the code (``reterm/generation.py``, the *sizes* block and ``STAGES`` of
``train/run_all.sh``, the recipe YAMLs), never written here, so a change of a default fails this test until the
prose says the same. Each phrasing checked must occur at least once where it is expected, so that rewording a
sentence out of the checked form fails too instead of silently escaping the check.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
RUN_ALL = (REPO / "train" / "run_all.sh").read_text()
RECIPES = REPO / "train" / "recipes" / "smollm2-135m"
DOCS = {name: (REPO / name).read_text() for name in ("README.md", "docs/REPRODUCING.md", "docs/ARCHITECTURE.md",
                                                      "train/README.md")}  # fmt: skip
# every page a user reads: README, docs/, the folders' READMEs and the card templates
PUBLIC_DOCS = sorted({REPO / "README.md", *(REPO / "docs").glob("*.md"), *REPO.glob("*/README.md"),
                      *(REPO / "reterm" / "cards" / "templates").glob("*.md")})  # fmt: skip
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
    kind = {"2": "two-stage", "3": "three-stage chain", "4": "four-stage chain"}[ev.get("--chain-stages", "2")]
    found = _matches(r"Recovery@1 from (\d+) own (two-stage|three-stage chain|four-stage chain) failure states",
                     need=["README.md", "docs/REPRODUCING.md"])  # fmt: skip
    for doc, (a, what) in found:
        assert int(a) == multistage, f"{doc}: Recovery@1 from {a} states; run_all.sh: --multistage-states {multistage}"
    for doc, (a, what) in found:  # README.md's sentence is checked for its number only
        assert doc == "README.md" or what == kind, f"{doc}: {what} states; run_all.sh: --chain-stages gives {kind}"


def test_stage_lists_are_run_all_s():
    want = stages()
    # run_all.sh's own header
    (header,) = re.findall(r"^# Stages, in order.*?\n(.*?)^# Resuming", RUN_ALL, re.M | re.S)
    assert re.findall(r"^#   ([a-z0-9-]+) ", header, re.M) == want, "train/run_all.sh header"
    # README: the list after `--from eval`
    (listed,) = re.findall(r"re-run from a stage on \(([a-z0-9 -]+)\)", DOCS["README.md"])
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
    assert re.findall(r"^\| ([a-z0-9-]+) \|", table, re.M) == want, "docs/REPRODUCING.md: the stage table"
    # README's run-folder tree has a line for the folder of each stage that writes one under RUN
    tree = DOCS["README.md"].split("```\nruns/smollm2-135m/\n", 1)[1].split("```", 1)[0]
    # (the GRPO stages' folders also at each further seed: "$RUN/grpo-reterm$S" is RUN/grpo-reterm-s43 too)
    seeds = [s.rsplit("-", 1)[1] for s in want if re.search(r"-s\d+$", s)]
    for folder, seeded in re.findall(r'stage "?[a-z-]+(?:\$S)?"? "\$RUN/([a-z-]+)(\$S)?"', RUN_ALL) + [("data-mined", "")]:
        assert re.search(rf"^  {folder}/", tree, re.M), f"README.md: the run-folder tree lacks {folder}/"
        for seed in seeds if seeded else []:
            assert re.search(rf"^  (.*, )?{folder}-{seed}/", tree, re.M), f"README.md: the tree lacks {folder}-{seed}/"


def test_no_budget_is_claimed_for_the_default_in_minutes_without_a_run():
    # the default's time is measured by a run (README "Measured", train/measured.py), not promised in prose
    help_text = re.findall(r"--size NAME\s+(.*)", RUN_ALL)
    assert help_text and not re.search(r"\d+ ?min|an hour", help_text[0]), help_text
    assert not re.search(r"sized for about an hour|at most 90 minutes", RUN_ALL + DOCS["docs/REPRODUCING.md"])


def test_seed_sources_the_docs_name_are_the_cpu_recipe_s():
    want = yaml.safe_load((RECIPES / "grpo.yaml").read_text())["seed_failure_sources"]
    for doc, (listed,) in _matches(r"`seed_failure_sources: \[([a-z_, ]+)\]`", need=["docs/REPRODUCING.md"]):
        assert [w.strip() for w in listed.split(",")] == want, f"{doc}: seed_failure_sources [{listed}]; grpo.yaml: {want}"
    for doc, (source,) in _matches(r"recipe seeds from the (?:two-stage drills' |four-stage chains' )?(\w+) "
                                   r"(?:ones|failed attempts)", need=["docs/REPRODUCING.md", "train/README.md"]):  # fmt: skip
        assert [source] == want, f"{doc}: the recipe seeds from {source}; grpo.yaml: {want}"
    tasks = {yaml.safe_load((RECIPES / n).read_text())["seed_tasks"] for n in ("grpo.yaml", "grpo_standard.yaml")}
    for doc, (pattern,) in _matches(r'`seed_tasks: "([^"]+)"', need=["docs/REPRODUCING.md"]):
        assert tasks == {pattern}, f"{doc}: seed_tasks {pattern!r}; the CPU GRPO recipes: {tasks}"


def test_the_mechanism_samples_at_the_grpo_recipes_temperature():
    from reterm.eval.mechanism import build_parser

    default = build_parser().parse_args(["--model", "m", "--output", "o"]).temperature
    recipe = {yaml.safe_load((RECIPES / r).read_text())["temperature"] for r in ("grpo.yaml", "grpo_standard.yaml")}
    (mech,) = re.findall(r"MECH_SIZE=\([^)]*--temperature ([\d.]+)", RUN_ALL)
    assert recipe == {default} == {float(mech)}, (default, recipe, mech)


def test_token_caps_in_the_model_card_and_the_9b_commands_are_the_recipes():
    from reterm.cards.model import TEMPLATE, turn_tokens
    from reterm.cards.model_inputs import load_recipe
    from reterm.generation import MAX_TURN_TOKENS

    # the card's generation example takes the cap from the recipe that trained the model, never a literal
    assert not re.findall(r"max_new_tokens=\d", TEMPLATE.read_text()), "templates/model.md: a literal max_new_tokens"
    cpu = [load_recipe(RECIPES / "sft.yaml"), load_recipe(RECIPES / "grpo.yaml")]
    big = REPO / "train" / "recipes" / "qwen3.5-9b"
    nine_b = yaml.safe_load((big / "grpo.yaml").read_text())["max_turn_tokens"]
    assert turn_tokens(cpu)[0] == turn_tokens(cpu[:1])[0] == MAX_TURN_TOKENS
    assert turn_tokens([load_recipe(big / "sft.yaml"), load_recipe(big / "grpo.yaml")])[0] == nine_b
    # ... and the rendered example carries it (huggingface_hub renders the template with jinja2)
    import jinja2

    page = jinja2.Template(TEMPLATE.read_text()).render(turn_tokens=turn_tokens(cpu), kind="full", repo_id="o/n",
                                                        pct=lambda x: x)  # fmt: skip
    assert f"max_new_tokens={MAX_TURN_TOKENS})" in page
    # the README's commands of the released 9B give it its recipe's cap, in the same command
    readme = DOCS["README.md"].replace("\\\n", " ")
    nine_b_lines = [ln for ln in readme.splitlines() if "ReTerm-9B" in ln and re.search(r"reterm (run|serve)", ln)]
    assert len(nine_b_lines) >= 2, nine_b_lines
    for line in nine_b_lines:
        caps = re.findall(r"max_new_tokens=(\d+)|--max-new-tokens (\d+)", line)
        assert caps and all(int(a or b) == nine_b for a, b in caps), f"README: {line.strip()!r} lacks the 9B's cap {nine_b}"


def test_the_readme_is_a_front_page():
    readme = DOCS["README.md"]
    lines = readme.splitlines()
    assert len(lines) <= 250, f"README.md: {len(lines)} lines (at most 250; history goes to docs/EXPERIMENTS.md)"
    # the first block: the two commands CI runs (.ci/run), exactly
    first = readme.split("```bash\n", 1)[1].split("```", 1)[0].splitlines()
    assert [ln.split("#")[0].strip() for ln in first] == ["bash train/run_all.sh", "bash tests/run.sh"], first
    ci = (REPO / ".ci" / "run").read_text()
    assert "bash train/run_all.sh --size ci" in ci and "bash tests/run.sh" in ci
    # the set-up command is named, in a command block, and exists
    assert re.search(r"^bash scripts/setup\.sh\b", readme, re.M) and (REPO / "scripts" / "setup.sh").is_file()


def test_the_readme_results_table_is_the_generated_one():
    sys.path.insert(0, str(REPO / "train"))
    import measured  # train/measured.py: the markers of the section it writes

    results = (REPO / "docs" / "RESULTS.md").read_text()
    generated = results.split(measured.BEGIN, 1)[1].split(measured.END, 1)[0]
    rows = {ln.split("|")[1].strip(): ln for ln in generated.splitlines() if ln.startswith("| ")}
    table = DOCS["README.md"].split("## Results", 1)[1].split("\n\n**", 1)[0]
    readme_rows = [ln for ln in table.splitlines() if ln.startswith("| ") and not ln.startswith("| model")]
    assert len(readme_rows) == 4, readme_rows
    for row in readme_rows:
        label, *cells = [c.strip() for c in row.strip("|").split("|")]
        assert label in rows, f"README: the row {label!r} is not in docs/RESULTS.md's generated table"
        for cell in cells:
            assert re.fullmatch(r"-?[\d.]+ \[[\d.]+, [\d.]+\] \(n=\d+\)", cell), f"README: {cell!r} lacks n or interval"
            assert cell in rows[label], f"README: {label}: {cell} is not in docs/RESULTS.md's row"
    # the run's commits, as the generated section names them
    (commits,) = re.findall(r"code at commits? ((?:`[0-9a-f]{7}`(?:, )?)+)", generated)
    assert commits in " ".join(DOCS["README.md"].split()), f"README: the run's commits {commits} not named"


@pytest.mark.parametrize("path", PUBLIC_DOCS, ids=lambda p: str(p.relative_to(REPO)))
def test_no_doc_names_an_issue_or_internal_words(path):
    text = " ".join(path.read_text().split())
    bad = re.findall(r"\b[Ii]ssues? \d+|\b[Tt]he acceptance\b|\b(?:[Tt]his|[Tt]hat|[Tt]he next) session\b", text)
    assert not bad, f"{path.relative_to(REPO)}: {bad}"


def test_harbor_job_folders_are_ignored():
    lines = [ln.strip() for ln in (REPO / ".gitignore").read_text().splitlines()]
    assert "/jobs/" in lines or "jobs/" in lines


def test_dry_run_says_done_already_only_for_a_completed_stage(tmp_path):
    def dry(run):
        out = subprocess.run(["bash", "train/run_all.sh", "--dry-run", "--run-dir", str(run)], cwd=REPO,
                             capture_output=True, text=True, timeout=60)  # fmt: skip
        assert out.returncode == 0, out.stderr
        return {b.split("]", 1)[0]: b for b in out.stdout.split("\n[")[1:]}

    fresh = dry(tmp_path / "fresh")
    assert not [s for s, b in fresh.items() if "done already" in b], "a fresh run folder has no completed stage"
    assert "(not done yet: runs; once done, skipped unless this command or train/recipes/smollm2-135m/sft.yaml " \
           "changed)" in fresh["sft"]
    (tmp_path / "r" / "stages").mkdir(parents=True)
    (tmp_path / "r" / "stages" / "sft.json").write_text("{}")
    some = dry(tmp_path / "r")
    assert "done already = skipped, unless this command or train/recipes/smollm2-135m/sft.yaml changed" in some["sft"]
    assert "not done yet" in some["data"]


def test_a_comment_edit_of_a_watched_recipe_re_runs_nothing(tmp_path, capsys):
    """Recipe comments are docs: fixing one must not re-run a completed training stage; a changed value must."""
    sys.path.insert(0, str(REPO / "train"))
    import stages

    cfg = tmp_path / "grpo.yaml"
    cfg.write_text("max_steps: 15   # 15 steps\n# time: not yet measured\nname: 'a # b'\n")
    ok = [sys.executable, "-c", "pass"]
    run = tmp_path / "run"
    assert stages.run_stage(run, "grpo", ok, [], later=[], watch=[cfg]) == 0
    cfg.write_text("# time: 9m15s, 5.0 GB\nmax_steps: 15      # a comment re-worded\n\nname: 'a # b'\n")
    capsys.readouterr()
    stages.run_stage(run, "grpo", ok, [], later=[], watch=[cfg])
    assert "done already" in capsys.readouterr().out
    cfg.write_text("max_steps: 15\nname: 'a # c'\n")  # inside a quoted string: a value, not a comment
    stages.run_stage(run, "grpo", ok, [], later=[], watch=[cfg])
    assert "changed since it completed" in capsys.readouterr().out
    # a record written with the older digest of the file's bytes still counts as done
    record = stages.read_marker(run, "grpo")
    record["inputs"] = {str(cfg): stages.raw_digest(cfg)}
    stages.write_json_atomic(stages.marker_path(run, "grpo"), record)
    stages.run_stage(run, "grpo", ok, [], later=[], watch=[cfg])
    assert "done already" in capsys.readouterr().out
