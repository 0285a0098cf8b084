"""The one agent harness used by data generation, training, evaluation and the Space.

- :mod:`reterm.agent.protocol`: system prompt, tool schemas, message layout, the action parser
  (:func:`~reterm.agent.protocol.parse_action`) and the observation format.
- :mod:`reterm.agent.terminal`: a persistent tmux terminal inside any Harbor environment
  (:class:`~reterm.agent.terminal.TerminalSession`), shell state for forks.
- :mod:`reterm.agent.episode`: the (lock-step, batched) episode loop and the verifier runner.
- :mod:`reterm.agent.atif`: trajectories to/from Harbor ATIF, chat messages and Harbor job folders.
- :mod:`reterm.agent.harbor`: ``ReTermAgent``, the harness as a Harbor agent.
- :mod:`reterm.agent.cli`: ``reterm run``.

Submodules are imported on use (this package imports nothing), so ``import reterm.agent.protocol``
stays light.
"""
