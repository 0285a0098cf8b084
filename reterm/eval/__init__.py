"""Evaluation through Harbor: Pass@1 ± stderr, pass@k, recovery rates per error category.

``python -m eval.run --config eval/configs/NAME.yaml`` from the repository root (or ``reterm eval``) runs
the Harbor jobs and writes the report; :mod:`reterm.eval.metrics` scores job folders,
:mod:`reterm.eval.recovery` measures recovery, :mod:`reterm.eval.report` writes ``results.json``, ``report.md`` and the PNG plots.
"""
