"""The local sandbox: a Harbor environment without a container engine, with snapshot and fork.

- :mod:`reterm.sandbox.local` — ``LocalEnvironment`` (the Harbor ``BaseEnvironment``; ``for_task``,
  ``snapshot``, ``fork``, ``from_snapshot``).
- :mod:`reterm.sandbox.box` — one running sandbox (bubblewrap + overlayfs + cgroups).
- :mod:`reterm.sandbox.rootless` — root or rootless mode (unprivileged user namespaces) and its checks.
- :mod:`reterm.sandbox.build` / :mod:`reterm.sandbox.dockerfile` — the task layer from a Dockerfile.
- :mod:`reterm.sandbox.base_image` — the cached Debian base root filesystem (debootstrap).
- :mod:`reterm.sandbox.snapshot`, :mod:`reterm.sandbox.sweep`, :mod:`reterm.sandbox.cgroups`,
  :mod:`reterm.sandbox.paths`, :mod:`reterm.sandbox.preflight`, :mod:`reterm.sandbox.cli`.

Kept import-light (no Harbor import here): import ``LocalEnvironment`` from ``reterm.sandbox.local``.
See docs/SANDBOX.md.
"""
