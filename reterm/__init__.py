"""ReTerm kit: training terminal agents that recover from their own failures.

The shared library. Modules (see ``docs/ARCHITECTURE.md``):

- ``reterm.sandbox``: local Harbor environment (bubblewrap + overlayfs) with snapshot/fork; replay fork.
- ``reterm.tasks``: load Harbor / Terminal-Bench task folders; offline verifier shim.
- ``reterm.agent``: the one agent harness (prompt, action parser, terminal session, episode loop).
- ``reterm.policies``: transformers, OpenAI-compatible endpoint and scripted policies.
- ``reterm.trajectory``: the trajectory schema and its conversions (chat messages, ATIF, Harbor jobs).
- ``reterm.recovery``: failure localisation, error taxonomy, recovery metrics.
"""

__version__ = "0.1.0"
