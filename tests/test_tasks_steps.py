"""reterm.tasks.steps: solve.sh split into top-level terminal commands, checked with bash itself."""

import subprocess
from pathlib import Path

import pytest

from reterm.tasks import SolutionSplitError, find_task_dirs, solution_steps, split_commands

SUITE = Path(__file__).resolve().parents[1] / "tasks"

SCRIPT = r"""#!/bin/bash
# Reference solution.
set -euo pipefail

cd /app   # go there
cat > /app/x.py <<'PY'
# a comment inside the heredoc stays

print("hi")
PY
if [ -f /app/x.py ]; then
  echo yes
else
  echo no
fi
for f in a b; do echo "$f"; done
tar -czf /tmp/a.tgz \
  /app/x.py
make clean &&
  make
f() {
  echo "in f"
}
echo "a multi-line
string"
exit 0
"""


def test_split_commands_groups_blocks_and_skips_noise():
    steps = split_commands(SCRIPT)
    assert steps == [
        "cd /app   # go there",
        "cat > /app/x.py <<'PY'\n# a comment inside the heredoc stays\n\nprint(\"hi\")\nPY",
        "if [ -f /app/x.py ]; then\n  echo yes\nelse\n  echo no\nfi",
        'for f in a b; do echo "$f"; done',
        "tar -czf /tmp/a.tgz \\\n  /app/x.py",
        "make clean &&\n  make",
        'f() {\n  echo "in f"\n}',
        'echo "a multi-line\nstring"',
    ]


def test_steps_replayed_in_one_shell_give_the_script_result(tmp_path):
    script = f"""cd {tmp_path}
cat > out.txt <<'EOF'
line one
EOF
if [ -s out.txt ]; then
  echo two >> out.txt
fi
set -e
exit 3
"""
    steps = split_commands(script)
    assert len(steps) == 3
    # typed one after another into a persistent bash (as the scripted oracle policy does)
    proc = subprocess.run(["bash"], input="\n".join(steps) + "\n", capture_output=True, text=True)
    assert proc.returncode == 0
    assert (tmp_path / "out.txt").read_text() == "line one\ntwo\n"


@pytest.mark.parametrize("bad, line", [
    ("echo ok\nif true; then\n  echo never closed\n", 2),
    ("echo ok\ncat <<EOF\nno terminator\n", 2),
    ("echo ok\necho 'unclosed\n", 2),
])
def test_unfinished_command_names_the_line(bad, line):
    with pytest.raises(SolutionSplitError, match=rf"solve.sh:{line}: the command starting here never completes"):
        split_commands(bad)


def test_missing_solution(tmp_path):
    with pytest.raises(FileNotFoundError, match="no reference solution"):
        solution_steps(tmp_path)


@pytest.mark.parametrize("task_dir", find_task_dirs(SUITE), ids=lambda p: p.name)
def test_suite_solutions_split_into_valid_commands(task_dir):
    steps = solution_steps(task_dir)
    assert steps, "empty solution"
    for step in steps:
        assert subprocess.run(["bash", "-n"], input=step + "\n", capture_output=True, text=True).returncode == 0, step
        first = step.split()[0]
        assert first not in ("exit", "set", "vi", "vim", "nano", "less"), step
    assert not any(step.lstrip().startswith("#") for step in steps)
