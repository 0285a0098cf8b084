"""The Hub cards: the dataset card and the model card, rendered from what the kit wrote.

- :mod:`reterm.cards.dataset`: :func:`render_dataset_card` (``templates/dataset.md`` filled from a dataset folder
  in the layout of :mod:`reterm.data.layout`, with its ``stats.json`` (:mod:`reterm.data.dataset_stats`)).
- :mod:`reterm.cards.model`: :func:`render_model_card` (``templates/model.md`` filled from a checkpoint folder).
- :mod:`reterm.cards.model_inputs`: :class:`EvalResults` (the part of ``results.json`` the model card reads),
  :func:`load_recipe` (TRL YAML recipes, secrets redacted).

``python dataset_card/render.py`` and ``python model_card/render.py`` (thin scripts at the repository root)
run their ``main``.
"""
