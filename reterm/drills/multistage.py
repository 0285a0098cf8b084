"""Multi-stage drills: two (or more) drill hurdles chained into one task.

The paper's mechanism (ReTerm-GRPO forks recovery attempts from the agent's own failure states) pays off
where a failed attempt keeps real progress: the agent cleared the first hurdle, then failed the second. From
the task's start a group must clear every hurdle, so a policy that clears each with probability ``p`` passes
with about ``p**stages`` and most groups give equal (all-zero) rewards; from a state where the first hurdle is
done, the group faces one hurdle and its rewards differ more often. These tasks measure that directly
(:mod:`reterm.eval.mechanism`, issue 24).

A multi-stage drill is an ordinary drill (:class:`reterm.drills.model.Drill`, written by
:func:`reterm.drills.generate.task_files`): the stages' files, build commands, checks and hidden test files
are merged (their names come from independent random draws; two different files at one path are refused), the solution is
the stages' solutions in order, the first mistake is the first stage's, the recovery after it the first stage's
recovery and then the other stages' solutions, and the category is the first stage's. Its family is ``multi:<a>+<b>`` (``multi:<a>+<b>+<c>`` for three stages, ...). Instances are determined by
``(seed, index, stages)`` like single drills.

**Chains** are the drills of three or more stages (:data:`CHAIN_STAGES`): the same composition, where recovery
pays most (with a per-stage success ``p`` a fresh attempt passes about ``p**k``, one resumed with ``j`` stages done
about ``p**(k-j)``). A chain's verifier also names its progress (:func:`compose` with ``progress``): after the
checks it prints ``STAGES DONE: j of k`` and ``STAGES LEFT: part 3 (<family>), ...``, so a failure state has a
number of stages done (:func:`stages_done`). Two-stage drills keep the files they had before chains existed (the
measured runs' tasks): their verifier prints no progress line, and :func:`stages_done` gives ``None`` for them.
A chain of ``k`` stages draws its stages with its own random stream (``reterm-chain<k>/<seed>/<index>``) and its
stage instances from indices 100 to 999 above ``1000 * index`` (never one of the first 100 single-stage instances
of a family, where the single-stage train and test drills are); its folder is ``chain<k>-<index:03d>``.

Splits: held-out chains (:func:`generate_multistage`, indices below :data:`TRAIN_START`) and train chains
(:func:`add_train_instances`, indices from :data:`TRAIN_START`) never share a stage instance (their stage indices
are below and above ``1000 * TRAIN_START``), and train chains draw their stages from the drills folder's
in-distribution families only, so a held-out family is never trained in a chain.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from reterm.agent.protocol import verifier_progress
from reterm.drills.families import DEFAULT_OOD_FAMILIES, FAMILIES
from reterm.drills.generate import DrillInstance, instance_name, make_drill, task_files, write_task
from reterm.drills.model import Drill
from reterm.recovery.taxonomy import Category
from reterm.trajectory import write_json_atomic


def stage_families(families: list[str] | tuple[str, ...]) -> tuple[str, ...]:
    """The ones of ``families`` a stage may be drawn from: those whose mistake does not hang (a stage whose
    mistake never returns would end most attempts at the first hurdle, whatever the policy)."""
    return tuple(name for name in families if FAMILIES[name].category is not Category.TIMEOUT_HANG)


DEFAULT_STAGE_FAMILIES: tuple[str, ...] = stage_families([n for n in FAMILIES if n not in DEFAULT_OOD_FAMILIES])
"""Families a stage is drawn from by default: the in-distribution ones, without hanging mistakes."""

CHAIN_STAGES = (3, 4)
"""The chain lengths the kit generates and tests beside the two-stage drills."""

TRAIN_START = 10_000
"""First index of the multi-stage ``train`` instances a drills folder may hold
(:func:`reterm.drills.generate.generate_drills`); the mechanism's tasks use indices below it, so the two never
share an instance."""


def compose(stages: list[Drill], *, progress: bool | None = None) -> Drill:
    """One drill that asks for every stage in order.

    ``progress``: the verifier also prints the stages done and left (``STAGES DONE: j of k``; default: for
    chains of three or more stages; see the module docstring).

    Raises:
        ValueError: fewer than two stages, or two stages write different content to one environment or test file.
    """
    if progress is None:
        progress = len(stages) >= 3
    if len(stages) < 2:
        raise ValueError(f"a multi-stage drill needs at least 2 stages, got {len(stages)}")
    files: dict = {}
    test_files: dict = {}
    for d in stages:
        for path, f in d.files.items():
            if path in files and files[path] != f:  # the same placeholder (``.keep``) in both is fine
                raise ValueError(f"stages {d.family} and another both write {path}")
            files[path] = f
        for rel, text in d.test_files.items():
            if rel in test_files:
                raise ValueError(f"stages {d.family} and another both write tests/{rel}")
            test_files[rel] = text
    parts = "\n".join(f"Part {i}: {d.instruction.strip()}" for i, d in enumerate(stages, 1))
    first = stages[0]
    return Drill(
        family="multi:" + "+".join(d.family for d in stages), category=first.category,
        instruction=f"This task has {len(stages)} parts; do all of them, in order.\n{parts}",
        files=files, checks=[c for d in stages for c in d.checks], solution=[c for d in stages for c in d.solution],
        first_mistake=first.first_mistake, mistake_signal=first.mistake_signal, topic=first.topic,
        tags=sorted({t for d in stages for t in d.tags} | {"multi-stage"}), run=[c for d in stages for c in d.run],
        test_files=test_files, recovery=[*first.recovery_commands, *(c for d in stages[1:] for c in d.solution)],
        stages=len(stages), stage_checks=[len(d.checks) for d in stages] if progress else [],
        parts=[{"family": d.family, "solution": list(d.solution), "first_mistake": d.first_mistake,
                "recovery": d.recovery_commands} for d in stages],
    )  # fmt: skip


def make_multistage(seed: int, index: int, *, families: tuple[str, ...] | list[str] = DEFAULT_STAGE_FAMILIES,
                    stages: int = 2) -> Drill:  # fmt: skip
    """Instance ``index``: ``stages`` distinct families drawn from ``families``, each an independent instance.

    Raises:
        ValueError: fewer families than stages; KeyError: an unknown family.
    """
    families = list(families)
    if stages < 2:
        raise ValueError(f"a multi-stage drill needs at least 2 stages, got {stages}")
    if len(families) < stages:
        raise ValueError(f"{stages} stages need at least {stages} families, got {families}")
    # two stages: the stream and instance range the two-stage drills always had (their tasks are unchanged)
    rng = random.Random(f"reterm-multistage/{seed}/{index}" if stages == 2 else f"reterm-chain{stages}/{seed}/{index}")
    low = 0 if stages == 2 else 100
    chosen = rng.sample(families, stages)
    for _ in range(8):  # a file collision between two independent draws is rare; draw other instances then
        try:
            return compose([make_drill(f, seed, 1000 * index + rng.randrange(low, 1000)) for f in chosen])
        except ValueError:
            continue
    raise ValueError(f"multi-stage drill {index}: stages {chosen} collide in every draw")


def chain_name(stages: int, index: int) -> str:
    """The folder (and task) name of a multi-stage drill: ``multi-<index:03d>`` for two stages (as it always
    was), ``chain<k>-<index:03d>`` for a chain of ``k`` stages."""
    return instance_name("multi" if stages == 2 else f"chain{stages}", index)


def stages_done(verifier_output: str | None) -> tuple[int, int] | None:
    """``(stages done, stages)`` from a chain verifier's output (its ``STAGES DONE: j of k`` line; the last one
    when there are several; :func:`reterm.agent.protocol.verifier_progress`); ``None`` when the output has no such line (a two-stage or single-stage drill, no
    verifier output, or output cut before the line).

    Raises:
        ValueError: a ``STAGES DONE:`` line that is not ``j of k`` with ``0 <= j <= k`` (quoted).
    """
    progress = verifier_progress(verifier_output)
    return None if progress is None else progress[:2]


@dataclass(frozen=True)
class MultiStageInstance:
    """One written multi-stage drill: its folder name, family (``multi:a+b``), first stage's category, path."""

    name: str
    family: str
    category: str
    path: Path


def generate_multistage(out: str | Path, seed: int, n: int, *,
                        families: tuple[str, ...] | list[str] = DEFAULT_STAGE_FAMILIES,
                        stages: int = 2, write: bool = True) -> list[MultiStageInstance]:  # fmt: skip
    """Write ``n`` held-out multi-stage drills under ``out`` (:func:`chain_name`: ``multi-<index:03d>``,
    ``chain3-<index:03d>``, ...; existing identical folders are rewritten atomically, so a rerun gives the same
    folders). Returns them in index order.

    ``write=False`` writes nothing and returns the same instances from folders an earlier call wrote (a process
    that works on drills another one wrote, and may be reading, uses it).

    Raises:
        FileNotFoundError: with ``write=False``, a drill's folder is missing (named).
    """
    out = Path(out)
    done = []
    for i in range(n):
        drill = make_multistage(seed, i, families=families, stages=stages)
        name = chain_name(stages, i)
        if not write:
            if not (out / name / "task.toml").is_file():
                raise FileNotFoundError(f"{out / name}: no drill there (write the drills first)")
            done.append(MultiStageInstance(name, drill.family, drill.category, out / name))
            continue
        path = write_task(task_files(drill, name=name, split="test", seed=seed, index=i), out / name)
        done.append(MultiStageInstance(name, drill.family, drill.category, path))
    return done


def add_train_instances(out: str | Path, n: int, *, stages: int = 2) -> list[DrillInstance]:
    """Add ``n`` ``train`` instances of ``stages`` stages to a drills folder written by
    :func:`reterm.drills.generate.generate_drills` (``reterm tasks drills --multistage N [--chain-stages K]``);
    two-stage instances are ``multi-10000``, ..., chains ``chain<K>-10000``, ... (:func:`chain_name`).

    Their stages are drawn from the folder's in-distribution families (:func:`stage_families`: held-out families
    never appear), their indices start at :data:`TRAIN_START` (``multi-10000``, ...; never one of the mechanism's
    tasks) and the folder's seed; ``splits.json`` gets them in ``train`` and ``tasks`` and records
    ``drills.multistage = n``. Records on them teach the SFT cold start to carry on after a hurdle
    (:mod:`reterm.data.drills`).

    Raises:
        ValueError: ``n`` < 0, or the folder has no ``splits.json`` of generated drills (named).
    """
    if n < 0:
        raise ValueError(f"multistage must be 0 or more, not {n}")
    if stages < 2:
        raise ValueError(f"chain stages must be 2 or more, not {stages}")
    out = Path(out)
    path = out / "splits.json"
    splits = json.loads(path.read_text()) if path.is_file() else {}
    meta = splits.get("drills")
    if not isinstance(meta, dict) or "seed" not in meta:
        raise ValueError(f"{path}: not a generated drills folder (no 'drills' entry); run `reterm tasks drills` first")
    seed = int(meta["seed"])
    fams = stage_families([f for f in meta["families"] if f not in meta.get("ood_families", [])])
    added = []
    for k in range(TRAIN_START, TRAIN_START + n):
        drill = make_multistage(seed, k, families=fams, stages=stages)
        name = chain_name(stages, k)
        write_task(task_files(drill, name=name, split="train", seed=seed, index=k), out / name)
        added.append(DrillInstance(name, drill.family, drill.category, k, "train", out / name, seed))
        if name not in splits["train"]:
            splits["train"].append(name)
        splits["tasks"][name] = {"categories": [drill.category], "difficulty": "medium", "family": drill.family}
    if stages == 2:
        meta["multistage"] = n
    else:
        meta.setdefault("chains", {})[str(stages)] = n
    write_json_atomic(path, splits)
    return added


def turn_budget(stages: int) -> int:
    """Turns an attempt on a drill of ``stages`` stages gets in the kit's runs: ``3 * stages + 2`` (8 for two
    stages, the budget the two-stage runs always had; 11 for three, 14 for four). A stage's reference is 1 to 4
    commands, 1.6 on average (384 stages of 128 three-stage chains of seed 0), so the whole reference with its
    submit leaves a margin: the longest reference, recovery or resumption of 128 chains of seed 0 needs 8 turns of
    11 (three stages) and 10 of 14 (four); ``tests/test_caps.py`` checks it, with at least 2 turns to spare.

    Raises:
        ValueError: ``stages`` < 1.
    """
    if stages < 1:
        raise ValueError(f"stages must be 1 or more, not {stages}")
    return 3 * stages + 2


def record_kinds(stages: int) -> tuple[str, ...]:
    """The scripted failed first attempts the SFT data types on a drill of ``stages`` stages, one per instance in
    turn (:func:`resume_plan` turns each into commands):

    - ``part<j>_submit`` (``j`` = 1 .. k-1): parts 1..j done, then submit: the state with ``j`` stages done; the
      teacher does the rest (the resumption);
    - ``part<j>_mistake`` (``j`` = 2 .. k): parts 1..j-1 done, then part j's natural first mistake, then submit;
      the teacher recovers part j and does the rest;
    - ``part1_mistake``: part 1's mistake, then submit; the teacher recovers part 1 and does the rest.

    For two stages this is ``("part1_submit", "part2_mistake", "part1_mistake")``, the order the two-stage data
    always had (so their records are unchanged).

    Raises:
        ValueError: ``stages`` < 2.
    """
    if stages < 2:
        raise ValueError(f"a multi-stage drill has 2 or more stages, not {stages}")
    return (*(f"part{j}_submit" for j in range(1, stages)), *(f"part{j}_mistake" for j in range(2, stages + 1)),
            "part1_mistake")  # fmt: skip


def resume_plan(parts: list[dict[str, Any]], kind: str) -> tuple[list[str], list[str], int]:
    """``(first attempt's commands, teacher's commands, stages done before the teacher)`` of a multi-stage drill
    (``parts`` from :func:`reterm.drills.generate.stage_parts`) for a :func:`record_kinds` entry: the first attempt
    is the reference of the stages done (then the next stage's mistake for ``part<j>_mistake``), the teacher's the
    rest (the stage's recovery after a mistake, then every later stage's solution).

    Raises:
        ValueError: an unknown kind, or one whose part is not in ``parts`` (both named).
    """
    head, _, tail = kind.partition("_")
    j = int(head[4:]) if head.startswith("part") and head[4:].isdigit() else 0
    if tail not in ("submit", "mistake") or not 1 <= j <= len(parts) or (tail == "submit" and j == len(parts)):
        raise ValueError(f"unknown multi-stage record kind {kind!r} for {len(parts)} stages "
                         f"(one of {record_kinds(max(2, len(parts)))})")  # fmt: skip
    later = [c for p in parts[j:] for c in p["solution"]]
    if tail == "submit":
        return [c for p in parts[:j] for c in p["solution"]], later, j
    done = [c for p in parts[: j - 1] for c in p["solution"]]
    return [*done, parts[j - 1]["first_mistake"]], [*parts[j - 1]["recovery"], *later], j - 1
