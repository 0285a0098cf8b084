"""Test helpers shipped with the package so every test suite (ours and users') can use them.

- :mod:`reterm.testing.hub_server`: a small Hugging Face Hub-compatible HTTP server (repos, commits, LFS,
  branches, downloads) for offline tests of ``huggingface_hub``, ``datasets`` and the ``hf`` CLI.
"""
