"""Outcome checks: main ends with the two original commits (fixed dates prove they are not re-created)."""
import subprocess

REPO = "/app/repo"


def git(*args):
    out = subprocess.run(["git", "-C", REPO, *args], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_main_restored_with_original_commits():
    log = git("log", "--format=%s|%cI|%aI", "main").splitlines()
    assert log == [
        "app: greet v2|2024-05-05T10:00:00Z|2024-05-05T10:00:00Z".replace("Z", "+00:00"),
        "docs: design notes for v2|2024-05-04T10:00:00+00:00|2024-05-04T10:00:00+00:00",
        "bump version to v2|2024-05-03T10:00:00+00:00|2024-05-03T10:00:00+00:00",
        "add app entry point|2024-05-02T10:00:00+00:00|2024-05-02T10:00:00+00:00",
        "initial import|2024-05-01T10:00:00+00:00|2024-05-01T10:00:00+00:00",
    ]


def test_files_and_clean_tree():
    assert git("rev-parse", "--abbrev-ref", "HEAD") == "main"
    assert git("status", "--porcelain") == ""
    assert "at-least-once" in git("show", "main:docs/design.md")
    assert git("show", "main:src/app.py") == "print('hello, v2')"
    assert "scratch.txt" not in git("ls-tree", "--name-only", "main")
