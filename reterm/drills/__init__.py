"""Recovery drills: a learnable task tier for small models on a CPU.

Each drill family (:data:`FAMILIES`) makes short Harbor tasks whose natural first mistake fails with a
clear message in one error category, and whose fix takes 1 to 4 commands. See ``docs/DRILLS.md``.

    from reterm.drills import generate_drills, check_drills

    instances = generate_drills("runs/drills", seed=0, per_family=40)      # folders + splits.json
    results = check_drills([i.path for i in instances])                     # oracle 1, null 0, mistake 0
"""

from reterm.drills.families import DEFAULT_OOD_FAMILIES, FAMILIES
from reterm.drills.generate import (
    SPLITS,
    DrillInstance,
    generate_drills,
    instance_name,
    make_drill,
    split_of,
    summary_table,
    task_files,
)
from reterm.drills.model import Check, Drill, EnvFile, Family

__all__ = [
    "Check",
    "DEFAULT_OOD_FAMILIES",
    "Drill",
    "DrillInstance",
    "EnvFile",
    "FAMILIES",
    "Family",
    "SPLITS",
    "generate_drills",
    "instance_name",
    "make_drill",
    "split_of",
    "summary_table",
    "task_files",
]
