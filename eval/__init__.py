"""Evaluation through Harbor: Pass@1 ± stderr, pass@k, recovery rates per error category.

``python -m eval.run --config eval/configs/NAME.yaml`` (or ``reterm eval``) runs the Harbor jobs and
writes the report; :mod:`eval.metrics` scores job folders, :mod:`eval.recovery` measures recovery,
:mod:`eval.report` writes ``results.json``, ``report.md`` and the PNG plots.
"""
