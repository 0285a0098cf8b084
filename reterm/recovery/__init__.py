"""Failure states, error categories and recovery metrics (ReTerm-10K, part 1).

- :mod:`.taxonomy` - the stable category ids (``Category``) and their definitions (docs/ERROR_TAXONOMY.md).
- :mod:`.classify` - rule-based labelling of one step (``StepRecord`` -> ``Classification``).
- :mod:`.judge` - ``Classifier``: rules first, an optional ``LLMJudge`` through any policy.
- :mod:`.localise` - ``localise(trajectory)`` -> ``LocalisationResult`` with :class:`.state.State` objects.
- :mod:`.state` - ``State``, the one failure-state type (and its ``Localisation``), ``state_id``.
- :mod:`.metrics` - per-category recovery rates (in-trial, and attempts from recorded states).
- :mod:`.classifier_eval` - precision/recall/F1 of the classifier on a labelled set.
"""

from reterm.recovery.classifier_eval import ClassificationReport, evaluate, load_labelled
from reterm.recovery.classify import Classification, StepRecord, classify_step
from reterm.recovery.judge import Classifier, LLMJudge, parse_judge_answer
from reterm.recovery.localise import InfraTag, LocalisationResult, localise, localise_many, step_records
from reterm.recovery.metrics import (
    AttemptRecovery,
    CategoryAttempts,
    CategoryRecovery,
    InTrialRecovery,
    RecoveryAttempt,
    attempt_recovery,
    in_trial_recovery,
    markdown_table,
)
from reterm.recovery.taxonomy import DEFINITIONS, FAILURE_CATEGORIES, LABELS, Category, parse_category

__all__ = [
    "AttemptRecovery",
    "Category",
    "CategoryAttempts",
    "CategoryRecovery",
    "Classification",
    "ClassificationReport",
    "Classifier",
    "DEFINITIONS",
    "FAILURE_CATEGORIES",
    "InTrialRecovery",
    "InfraTag",
    "LABELS",
    "LLMJudge",
    "LocalisationResult",
    "RecoveryAttempt",
    "StepRecord",
    "attempt_recovery",
    "classify_step",
    "evaluate",
    "in_trial_recovery",
    "load_labelled",
    "localise",
    "localise_many",
    "markdown_table",
    "parse_category",
    "parse_judge_answer",
    "step_records",
]
