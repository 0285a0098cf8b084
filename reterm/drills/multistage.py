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
recovery and then the other stages' solutions, and the category is the first stage's. Its family is ``multi:<a>+<b>``. Instances are determined by ``(seed, index)`` like single drills.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path

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

TRAIN_START = 10_000
"""First index of the multi-stage ``train`` instances a drills folder may hold
(:func:`reterm.drills.generate.generate_drills`); the mechanism's tasks use indices below it, so the two never
share an instance."""


def compose(stages: list[Drill]) -> Drill:
    """One drill that asks for every stage in order.

    Raises:
        ValueError: fewer than two stages, or two stages write different content to one environment or test file.
    """
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
        stages=len(stages),
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
    if len(families) < stages:
        raise ValueError(f"{stages} stages need at least {stages} families, got {families}")
    rng = random.Random(f"reterm-multistage/{seed}/{index}")
    chosen = rng.sample(families, stages)
    for _ in range(8):  # a file collision between two independent draws is rare; draw other instances then
        try:
            return compose([make_drill(f, seed, 1000 * index + rng.randrange(1000)) for f in chosen])
        except ValueError:
            continue
    raise ValueError(f"multi-stage drill {index}: stages {chosen} collide in every draw")


@dataclass(frozen=True)
class MultiStageInstance:
    """One written multi-stage drill: its folder name, family (``multi:a+b``), first stage's category, path."""

    name: str
    family: str
    category: str
    path: Path


def generate_multistage(out: str | Path, seed: int, n: int, *,
                        families: tuple[str, ...] | list[str] = DEFAULT_STAGE_FAMILIES,
                        stages: int = 2) -> list[MultiStageInstance]:  # fmt: skip
    """Write ``n`` multi-stage drills under ``out`` (``multi-<index:03d>``; existing identical folders are
    rewritten atomically, so a rerun gives the same folders). Returns them in index order."""
    out = Path(out)
    done = []
    for i in range(n):
        drill = make_multistage(seed, i, families=families, stages=stages)
        name = instance_name("multi", i)
        path = write_task(task_files(drill, name=name, split="test", seed=seed, index=i), out / name)
        done.append(MultiStageInstance(name, drill.family, drill.category, path))
    return done


def add_train_instances(out: str | Path, n: int) -> list[DrillInstance]:
    """Add ``n`` two-stage ``train`` instances to a drills folder written by
    :func:`reterm.drills.generate.generate_drills` (``reterm tasks drills --multistage N``).

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
        drill = make_multistage(seed, k, families=fams)
        name = instance_name("multi", k)
        write_task(task_files(drill, name=name, split="train", seed=seed, index=k), out / name)
        added.append(DrillInstance(name, drill.family, drill.category, k, "train", out / name, seed))
        if name not in splits["train"]:
            splits["train"].append(name)
        splits["tasks"][name] = {"categories": [drill.category], "difficulty": "medium", "family": drill.family}
    meta["multistage"] = n
    write_json_atomic(path, splits)
    return added
