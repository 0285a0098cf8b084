"""Outcome checks: wordfreq.py on files, stdin, options, tie order, errors."""
import subprocess

TOOL = ["python3", "/app/wordfreq.py"]


def run(args, stdin=None):
    return subprocess.run(TOOL + args, input=stdin, capture_output=True, text=True, timeout=20, cwd="/tmp")


def test_example():
    out = run(["-i", "-n", "3", "/app/samples/intro.txt"])
    assert out.returncode == 0, out.stderr
    assert out.stdout == "4\tthe\n2\tdog\n2\tfox\n"


def test_case_sensitive_by_default_and_multiple_files():
    out = run(["/app/samples/intro.txt", "/app/samples/second.txt"])
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[:5] == ["2\tThe", "2\tdog", "2\tfox", "2\tover", "2\tthe"]
    assert "1\tTHE" in lines and "1\tDog" in lines
    assert "1\tdoesn't" in lines and "1\tnot" in lines and "1\tever" in lines and "1\tNot" in lines


def test_stdin_and_dash():
    assert run([], stdin="b a b\n").stdout == "2\tb\n1\ta\n"
    assert run(["-", "/app/samples/second.txt"], stdin="over over\n").stdout.startswith("3\tover\n")


def test_unicode_digits_underscores_apostrophes():
    out = run(["--ignore-case"], stdin="Café café CAFÉ 42 x_y 'quoted' rock'n'roll it's\n")
    lines = out.stdout.splitlines()
    assert lines[0] == "3\tcafé"
    assert set(lines[1:]) == {"1\t42", "1\tx", "1\ty", "1\tquoted", "1\trock'n'roll", "1\tit's"}


def test_min_length_and_ties():
    out = run(["--min-length", "3", "-n", "4"], stdin="bb aaa ccc aaa ddd zz eee ccc\n")
    assert out.stdout == "2\taaa\n2\tccc\n1\tddd\n1\teee\n"


def test_missing_file():
    out = run(["/nonexistent/words.txt"])
    assert out.returncode == 2
    assert out.stdout == ""
    assert "/nonexistent/words.txt" in out.stderr
