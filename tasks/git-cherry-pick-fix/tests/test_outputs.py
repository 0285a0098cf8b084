"""Outcome checks: main = old main + the fix only; develop unchanged; clean tree."""
import subprocess

REPO = "/app/repo"


def git(*args):
    out = subprocess.run(["git", "-C", REPO, *args], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_main_checked_out_and_clean():
    assert git("rev-parse", "--abbrev-ref", "HEAD") == "main"
    assert git("status", "--porcelain") == ""


def test_develop_untouched():
    log = git("log", "--format=%s", "develop").splitlines()
    assert log == ["feat: experimental yaml output", "fix: handle empty input in parse_line",
                   "feat: add csv export", "docs: usage", "add parse_text", "initial parser"]
    assert git("log", "-1", "--format=%ad", "--date=iso-strict", "develop").startswith("2024-03-06")


def test_main_history_kept_and_fix_applied():
    subjects = git("log", "--format=%s", "main").splitlines()
    assert subjects[1:] == ["docs: usage", "add parse_text", "initial parser"], subjects
    assert "empty input" in subjects[0]
    assert git("rev-list", "--merges", "main") == ""
    # the original main commits are still the same objects (dates are fixed in the build)
    base = git("log", "-1", "--format=%ad", "--date=iso-strict", "main~1")
    assert base.startswith("2024-03-03")


def test_only_the_fix_on_main():
    files = set(git("ls-tree", "--name-only", "main").split())
    assert files == {"README.md", "parse.py"}
    assert git("diff", "develop~1", "main", "--", "parse.py") == ""
    code = git("show", "main:parse.py")
    ns = {}
    exec(code, ns)
    assert ns["parse_line"]("") is None
    assert ns["parse_line"](" a = b ") == ("a", "b")
