"""Recovery drills (reterm.drills): families, deterministic folders, variation, splits, the kit's loader and
checks, and every family in the real local sandbox (oracle 1.0, null 0.0, first mistake fails visibly)."""

import json
import re
import shutil
import tomllib
from collections import Counter
from pathlib import Path

import pytest

from reterm.drills import DEFAULT_OOD_FAMILIES, FAMILIES, generate_drills, make_drill, split_of
from reterm.drills.check import check_drills
from reterm.recovery.taxonomy import Category
from reterm.tasks import load_tasks, solution_steps
from reterm.tasks.check import check_path
from reterm.tasks.cli import main as tasks_main
from reterm.tasks.loader import content_hash


def _folders(root: Path) -> dict[str, str]:
    return {d.name: content_hash(d) for d in sorted(root.iterdir()) if d.is_dir()}


def test_families_cover_enough_categories():
    assert len(FAMILIES) >= 10
    cats = Counter(f.category for f in FAMILIES.values())
    assert len(cats) >= 6, cats
    assert all(Category(c).is_failure for c in cats)
    for name, fam in FAMILIES.items():
        drill = make_drill(name, 0, 0)
        assert drill.family == name and drill.category == fam.category.value
        assert 1 <= len(drill.solution) <= 4 and drill.first_mistake and drill.mistake_signal
        prose = re.sub(r"`[^`]*`", "CODE", drill.instruction)
        assert len(re.findall(r"[.!?](\s|$)", prose)) <= 2 and len(drill.instruction) <= 300, drill.instruction


# Hand labels (issue 22, item 6), written from the taxonomy's definitions (docs/ERROR_TAXONOMY.md,
# reterm.recovery.taxonomy.DEFINITIONS) and each family's first mistake and its output as docs/DRILLS.md lists
# them, not from the classifier. Per family: (the failed attempt's category, the label a person gives the
# mistake step itself). They differ where the mistake exits 0 with a wrong result: the step is a wrong use of a
# tool (wrong_command), the attempt fails only when it is declared done (premature_completion).
HAND_LABELS: dict[str, tuple[str, str]] = {
    "mkdir-parent": ("path_permission", "path_permission"),  # No such file or directory: the parent folder
    "exec-bit": ("path_permission", "path_permission"),  # Permission denied
    "cwd-relative": ("path_permission", "path_permission"),  # a relative path that does not exist from /
    # "Author identity unknown": the taxonomy puts every error raised by git under path_permission (by meaning
    # it is also missing initialisation, wrong_state; the written rule decides)
    "git-identity": ("path_permission", "path_permission"),
    "local-wheel": ("missing_dependency", "missing_dependency"),  # No module named, installable from a wheel
    "pythonpath-module": ("missing_dependency", "missing_dependency"),  # No module named
    # `python` is not there but `python3` is: the command name is wrong (nothing to install), a typo-like
    # wrong_command, although "command not found" reads as missing_dependency
    "python-alias": ("wrong_command", "wrong_command"),
    "tar-format": ("wrong_command", "wrong_command"),  # wrong flags for the archive format
    "copy-dir": ("wrong_command", "wrong_command"),  # cp without -r
    "off-by-one": ("faulty_implementation", "faulty_implementation"),  # the program's own check fails
    "env-var": ("wrong_state", "wrong_state"),  # X_DIR is not set
    "sqlite-schema": ("wrong_state", "wrong_state"),  # no such table: missing initialisation
    "stale-lock": ("wrong_state", "wrong_state"),  # a left-over pid file
    "follow-flag": ("timeout_hang", "timeout_hang"),  # never returns without --once
    "strip-components": ("premature_completion", "wrong_command"),  # exit 0, a stray top folder
    "sort-numeric": ("premature_completion", "wrong_command"),  # exit 0, lexical order
    "wc-number": ("premature_completion", "wrong_command"),  # exit 0, the file name in the output
}
# Where the kit disagrees with the hand labels, as (hand, kit). A change in either direction fails the tests
# below, so a disagreement is never silently added or hidden.
KNOWN_FAMILY_DISAGREEMENTS = {"python-alias": ("wrong_command", "missing_dependency")}
# The rule classifier on the mistake step (reterm.recovery.classify_step): it cannot see a wrong result behind
# exit 0 (it says none), and reads "command not found" as missing_dependency.
KNOWN_CLASSIFIER_DISAGREEMENTS = {
    "python-alias": ("wrong_command", "missing_dependency"),
    "strip-components": ("wrong_command", "none"),
    "sort-numeric": ("wrong_command", "none"),
    "wc-number": ("wrong_command", "none"),
}


def _disagreements(kit: dict[str, str], column: int) -> dict[str, tuple[str, str]]:
    return {f: (HAND_LABELS[f][column], kit[f]) for f in HAND_LABELS if kit.get(f) != HAND_LABELS[f][column]}


def _report(found: dict, known: dict) -> str:
    lines = [f"{f}: hand {h}, kit {k}" + ("" if known.get(f) == (h, k) else "  <- NEW") for f, (h, k) in found.items()]
    gone = [f for f in known if f not in found]
    return "disagreements with the hand labels:\n  " + "\n  ".join(lines) + (f"\nno longer disagreeing: {gone}" if gone else "")


def test_family_categories_against_hand_labels():
    """Every family's category compared with a hand label that does not come from the classifier; the
    disagreements are listed, and must be exactly the known ones."""
    assert set(HAND_LABELS) == set(FAMILIES), "label every new family by hand in HAND_LABELS"
    assert all(Category(a).is_failure and Category(s).is_failure for a, s in HAND_LABELS.values())
    kit = {name: fam.category.value for name, fam in FAMILIES.items()}
    found = _disagreements(kit, 0)
    assert found == KNOWN_FAMILY_DISAGREEMENTS, _report(found, KNOWN_FAMILY_DISAGREEMENTS)
    # what a written drill carries (task.toml's error_categories) is checked the same way
    found = _disagreements({name: make_drill(name, 0, 0).category for name in FAMILIES}, 0)
    assert found == KNOWN_FAMILY_DISAGREEMENTS, _report(found, KNOWN_FAMILY_DISAGREEMENTS)


def test_same_seed_gives_identical_folders(tmp_path):
    a = generate_drills(tmp_path / "a", 5, 3)
    generate_drills(tmp_path / "b", 5, 3)
    generate_drills(tmp_path / "c", 6, 3)
    assert _folders(tmp_path / "a") == _folders(tmp_path / "b")
    assert (tmp_path / "a" / "splits.json").read_bytes() == (tmp_path / "b" / "splits.json").read_bytes()
    other = _folders(tmp_path / "c")
    assert all(other[n] != h for n, h in _folders(tmp_path / "a").items())  # another seed, other instances
    assert len(a) == 3 * len(FAMILIES)
    # one instance alone is the same as the same index generated in a batch
    assert make_drill("git-identity", 5, 2) == make_drill("git-identity", 5, 2)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_instances_vary_in_names_values_and_wording(family):
    drills = [make_drill(family, 11, k) for k in range(8)]
    assert len({d.instruction for d in drills}) == 8
    assert len({d.first_mistake for d in drills}) >= 6, [d.first_mistake for d in drills]
    checks = [tuple(c.condition for c in d.checks) for d in drills]
    assert len(set(checks)) == 8  # the expected values differ: one instance's answer does not pass another
    # the wording varies too, not only the names in it
    assert len({re.sub(r"`[^`]*`", "X", d.instruction) for d in drills}) >= 2


def test_folders_load_check_and_replay(tmp_path):
    out = tmp_path / "drills"
    instances = generate_drills(out, 2, 2)
    loaded, errors = load_tasks(out)
    assert not errors and len(loaded) == len(instances)
    by_name = {t.name: t for t in loaded}
    for inst in instances:
        task = by_name[inst.name]
        meta = task.metadata
        assert task.task.config.model_dump()["task"]["name"] == f"drills/{inst.name}"
        assert meta["tier"] == "drills" and meta["family"] == inst.family and meta["drill_split"] == inst.split
        assert meta["error_categories"] == [inst.category]
        drill = make_drill(inst.family, 2, inst.index)
        assert meta["first_mistake"] == drill.first_mistake and meta["mistake_signal"] == drill.mistake_signal
        assert meta["recovery"] == drill.recovery_commands and 1 <= len(meta["recovery"]) <= 4
        assert solution_steps(task) == drill.solution  # the scripted oracle types exactly these commands
        assert task.task.config.agent.timeout_sec <= 120 and task.task.config.verifier.timeout_sec <= 30
        assert (out / inst.name / "environment" / "Dockerfile").read_text().startswith("FROM debian:bookworm-slim\n")
    checks, problems = check_path(out, build=False, progress=False)
    assert all(c.valid for c in checks) and problems == []


def test_splits_disjoint_ood_whole_and_stable(tmp_path):
    instances = generate_drills(tmp_path, 0, 8, ood_families=["copy-dir", "env-var"])
    splits = json.loads((tmp_path / "splits.json").read_text())
    train, test, ood = set(splits["train"]), set(splits["test"]), set(splits["test_ood"])
    assert not (train & test or train & ood or test & ood)
    assert train | test | ood == {i.name for i in instances} == set(splits["tasks"])
    fam = {i.name: i.family for i in instances}
    assert {fam[n] for n in ood} == {"copy-dir", "env-var"}
    assert not {fam[n] for n in train | test} & {"copy-dir", "env-var"}
    for f in set(FAMILIES) - {"copy-dir", "env-var"}:
        assert sum(fam[n] == f for n in test) == 2 and sum(fam[n] == f for n in train) == 6
    # an instance keeps its split when more instances are generated
    assert all(split_of(i.family, i.index, ood_families=["copy-dir", "env-var"], test_fraction=0.25) == i.split
               for i in generate_drills(tmp_path / "more", 0, 20, ood_families=["copy-dir", "env-var"])[:8])  # fmt: skip
    # the kit's split check accepts test_ood and flags a task listed twice
    checks, problems = check_path(tmp_path, build=False, progress=False)
    assert problems == []
    splits["train"].append(splits["test_ood"][0])
    (tmp_path / "splits.json").write_text(json.dumps(splits))
    _, problems = check_path(tmp_path, build=False, progress=False)
    assert any("is in both train and test_ood" in p for p in problems), problems


def test_regenerating_smaller_removes_stale_drills(tmp_path):
    generate_drills(tmp_path, 0, 3, families=["mkdir-parent", "exec-bit"], ood_families=["exec-bit"])
    (tmp_path / "notes").mkdir()
    generate_drills(tmp_path, 0, 2, families=["mkdir-parent", "exec-bit"], ood_families=["exec-bit"])
    names = sorted(d.name for d in tmp_path.iterdir() if d.is_dir())
    assert names == ["exec-bit-000", "exec-bit-001", "mkdir-parent-000", "mkdir-parent-001", "notes"]


def test_multistage_train_drills_are_sound_and_never_the_mechanisms_tasks(tmp_path):
    """``--multistage N``: N two-stage train instances next to the single ones, sound in the sandbox (oracle 1,
    null 0, first mistake 0, recovery 1), none of them one of the mechanism's multi-stage tasks."""
    from reterm.drills.multistage import TRAIN_START, add_train_instances, generate_multistage

    assert tasks_main(["drills", "--out", str(tmp_path / "d"), "--per-family", "1", "--no-check", "--multistage", "2",
                       "--families", "mkdir-parent,exec-bit,python-alias,copy-dir", "--ood-families", "copy-dir"]) == 0
    splits = json.loads((tmp_path / "d" / "splits.json").read_text())
    multi = [n for n in splits["train"] if n.startswith("multi-")]
    assert multi == [f"multi-{TRAIN_START}", f"multi-{TRAIN_START + 1}"] and splits["drills"]["multistage"] == 2
    for name in multi:
        meta = tomllib.loads((tmp_path / "d" / name / "task.toml").read_text())["metadata"]
        stages = meta["family"].removeprefix("multi:").split("+")
        assert len(stages) == 2 and "copy-dir" not in stages and meta["drill_split"] == "train"  # never an OOD family
        assert splits["tasks"][name]["family"] == meta["family"]
    theirs = generate_multistage(tmp_path / "m", 0, 40, families=["mkdir-parent", "exec-bit", "python-alias"])
    instructions = {(t.path / "instruction.md").read_text() for t in theirs}
    assert not instructions & {(tmp_path / "d" / n / "instruction.md").read_text() for n in multi}
    results = check_drills([tmp_path / "d" / n for n in multi], progress=False)
    for r in results:
        assert r.error is None and (r.oracle_reward, r.null_reward, r.mistake_reward, r.recovery_reward) == (
            1.0, 0.0, 0.0, 1.0), r
    with pytest.raises(ValueError, match="multistage must be 0 or more"):
        add_train_instances(tmp_path / "d", -1)
    with pytest.raises(ValueError, match="not a generated drills folder"):
        add_train_instances(tmp_path / "nothing", 2)


def test_bad_options_are_named(tmp_path):
    with pytest.raises(ValueError, match="unknown drill family"):
        generate_drills(tmp_path, 0, 1, families=["no-such-family"])
    with pytest.raises(ValueError, match="not among the generated"):
        generate_drills(tmp_path, 0, 1, families=["mkdir-parent", "exec-bit"], ood_families=["copy-dir"])
    with pytest.raises(ValueError, match="no family is left"):
        generate_drills(tmp_path, 0, 1, families=["mkdir-parent"], ood_families=["mkdir-parent"])
    assert tasks_main(["drills", "--out", str(tmp_path), "--families", "nope", "--no-check"]) == 2


def test_cli_writes_folders_and_table(tmp_path, capsys):
    rc = tasks_main(["drills", "--out", str(tmp_path), "--seed", "3", "--per-family", "4", "--no-check",
                     "--families", "mkdir-parent,exec-bit,copy-dir", "--ood-families", "copy-dir"])  # fmt: skip
    assert rc == 0
    table = capsys.readouterr().out
    assert "| mkdir-parent | path_permission | 3 | 1 | 0 |" in table and "| copy-dir | wrong_command | 0 | 0 | 4 |" in table
    meta = tomllib.loads((tmp_path / "copy-dir-002" / "task.toml").read_text())["metadata"]
    assert meta["drill_split"] == "test_ood" and meta["drill_seed"] == 3


@pytest.mark.slow  # every family in the sandbox, ~23 s
def test_every_family_sound_in_the_local_sandbox(tmp_path):
    """One instance per family: oracle 1.0, null 0.0; the first mistake prints its error, leaves reward 0 and is
    labelled with the family's category."""
    from reterm.sandbox.preflight import missing_tools

    if missing := missing_tools():
        pytest.fail(f"the local sandbox needs {missing}: run scripts/setup.sh")
    instances = generate_drills(tmp_path, 4, 1, ood_families=DEFAULT_OOD_FAMILIES)
    results = check_drills([i.path for i in instances], concurrency=2, progress=False)
    for r in results:
        assert r.error is None, (r.name, r.error)
        assert (r.oracle_reward, r.null_reward, r.mistake_reward, r.recovery_reward) == (1.0, 0.0, 0.0, 1.0), r
        assert r.mistake_output.strip() and r.signal_seen, (r.name, r.mistake_output)
        assert r.mistake_timed_out == (r.family == "follow-flag"), r.name
        assert r.ok
        # the kit's rule classifier gives the mistake the family's category (exit 0 -> none: premature completion)
        assert r.label_agrees, (r.name, r.category, r.mistake_label, r.mistake_output)
    assert {r.family for r in results} == set(FAMILIES)
    # the classifier's label of the real mistake output against the hand label of the step (not circular)
    found = _disagreements({r.family: r.mistake_label for r in results}, 1)
    assert found == KNOWN_CLASSIFIER_DISAGREEMENTS, _report(found, KNOWN_CLASSIFIER_DISAGREEMENTS)


def test_check_reports_a_broken_drill(tmp_path):
    """A drill whose solution does not solve it, or whose mistake does not fail, is reported (family, seed)."""
    inst = generate_drills(tmp_path, 9, 1, families=["mkdir-parent", "wc-number"], ood_families=[])
    broken = {i.family: i.path for i in inst}
    (broken["mkdir-parent"] / "solution" / "solve.sh").write_text("#!/bin/bash\ntrue\n")
    toml = broken["wc-number"] / "task.toml"
    meta = tomllib.loads(toml.read_text())["metadata"]
    toml.write_text(toml.read_text().replace(json.dumps(meta["first_mistake"]),
                                             json.dumps("echo hi; wc -l < /dev/null > /dev/null")))  # fmt: skip
    results = {r.family: r for r in check_drills(list(broken.values()), progress=False)}
    assert not results["mkdir-parent"].ok and results["mkdir-parent"].seed == 9
    assert any("oracle reward 0.0" in p for p in results["mkdir-parent"].problems_found())
    assert any("lacks mistake_signal" in p for p in results["wc-number"].problems_found())
    shutil.rmtree(tmp_path)


def test_docs_list_every_family():
    text = (Path(__file__).resolve().parents[1] / "docs" / "DRILLS.md").read_text()
    for name, fam in FAMILIES.items():
        assert f"| {name} | {fam.category.value} |" in text, name
    for name in DEFAULT_OOD_FAMILIES:
        assert f"`{name}`" in text


@pytest.mark.slow
def test_harness_replays_solution_and_localises_the_first_mistake(tmp_path):
    """Through the kit's harness (tmux terminal, scripted policy, verifier): the solution's steps succeed; the
    injected first mistake fails and is localised with the family's category; the mistake then the recovery
    commands, typed into the same shell, succeed."""
    import asyncio

    from reterm.agent.episode import EpisodeSpec, run_episodes
    from reterm.policies.scripted import ScriptedPolicy
    from reterm.recovery import localise
    from reterm.sandbox.local import LocalEnvironment
    from reterm.trajectory import Outcome

    async def episode(task_dir, commands, timeout):
        env = LocalEnvironment.for_task(task_dir)
        await env.start(force_build=False)
        try:
            (traj,) = await run_episodes(ScriptedPolicy(commands, timeout=timeout, name="drill"),
                                         [EpisodeSpec(env, task_dir)], max_turns=len(commands) + 1,
                                         command_timeout_s=timeout, verify=True)  # fmt: skip
        finally:
            await env.stop(delete=True)
        return traj

    async def main():
        out = {}
        for inst in generate_drills(tmp_path, 13, 1):
            meta = tomllib.loads((inst.path / "task.toml").read_text())["metadata"]
            good = await episode(inst.path, solution_steps(inst.path), 20)
            bad = await episode(inst.path, [meta["first_mistake"]], meta.get("mistake_timeout_sec", 20))
            fixed = await episode(inst.path, [meta["first_mistake"], *meta["recovery"]], meta.get("mistake_timeout_sec", 20))
            out[inst.family] = (good, bad, fixed, inst.category)
        return out

    for family, (good, bad, fixed, category) in asyncio.run(main()).items():
        assert good.outcome == Outcome.SUCCESS, (family, good.outcome, [s.observation for s in good.steps])
        assert bad.outcome == Outcome.FAILURE, (family, bad.outcome)
        primary = localise(bad).primary
        assert primary is not None and primary.category == category, (family, primary, bad.steps[0].observation)
        assert fixed.outcome == Outcome.SUCCESS, (family, fixed.outcome, [s.observation for s in fixed.steps])
