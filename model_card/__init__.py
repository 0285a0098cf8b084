"""The ReTerm model card: inputs (evaluation results, TRL recipes) and the renderer.

- :mod:`model_card.inputs`: :class:`EvalResults` (the part of ``eval/`` ``results.json`` the card reads),
  :func:`load_recipe` (TRL YAML recipes, secrets redacted).
- :mod:`model_card.render`: :func:`render_model_card` (``template.md`` filled from a checkpoint folder).
"""

from typing import Any

from model_card.inputs import EvalResults, Recipe, load_recipe, load_results

__all__ = ["EvalResults", "Recipe", "load_recipe", "load_results", "render_model_card"]


def __getattr__(name: str) -> Any:  # lazy, so `python -m model_card.render` runs without a warning
    if name == "render_model_card":
        from model_card.render import render_model_card

        return render_model_card
    raise AttributeError(name)
