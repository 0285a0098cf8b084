"""The ``reterm`` console command.

Each sub-command lives in the module that owns it and exposes ``main(argv: list[str]) -> int``;
this file only dispatches, importing the module lazily so ``reterm --help`` stays fast.
"""

from __future__ import annotations

import importlib
import os
import sys

from reterm.generation import apply_thread_policy

# sub-command -> (module with main(argv), one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "sandbox": ("reterm.sandbox.cli", "prepare the local sandbox's base image; sweep leftovers"),
    "tasks": ("reterm.tasks.cli", "check and verify task folders (oracle and null agents); generate drills; "
              "decontaminate a training collection"),
    "run": ("reterm.agent.cli", "run one episode of the agent on a task and print it step by step"),
    "serve": ("reterm.policies.serve", "serve a local model behind an OpenAI-compatible API"),
    "data": ("reterm.data.build", "build the ReTerm-10K recovery dataset (`reterm data build`)"),
    "eval": ("reterm.eval.run", "evaluate models through Harbor (Pass@1, recovery rates)"),
    "publish": ("reterm.publish", "publish a dataset, model or Space to the Hugging Face Hub"),
}


def _usage() -> str:
    width = max(map(len, COMMANDS))
    lines = ["usage: reterm COMMAND [ARGS...]", "", "commands:"]
    lines += [f"  {name:<{width}}  {help_}" for name, (_, help_) in COMMANDS.items()]
    lines += ["", "`reterm COMMAND --help` describes one command."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Dispatch ``reterm COMMAND ...`` to the owning module's ``main``.

    Returns the process exit status (2 for an unknown command).
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(_usage())
        return 0
    name, rest = argv[0], argv[1:]
    if name == "data" and rest[:1] == ["build"]:
        rest = rest[1:]
    if name not in COMMANDS:
        print(f"reterm: unknown command {name!r}\n\n{_usage()}", file=sys.stderr)
        return 2
    # the shared thread policy (OMP_WAIT_POLICY=PASSIVE, reterm.generation): before torch loads, and only
    # when the user has not chosen (tests/run.sh does the same)

    apply_thread_policy()
    # the kit prices no tokens: LiteLLM (imported with Harbor) then reads its bundled cost map instead of
    # retrying a download for about 19 s when offline
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    module = importlib.import_module(COMMANDS[name][0])
    return int(module.main(rest) or 0)


if __name__ == "__main__":
    sys.exit(main())
