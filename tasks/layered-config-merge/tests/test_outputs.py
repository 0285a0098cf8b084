"""Outcome checks: merge rules, env overrides, output format, error handling."""
import json
import os
import subprocess


def run(files, env=None, tmp=None):
    e = {k: v for k, v in os.environ.items() if not k.startswith("APP__")}
    e.update(env or {})
    return subprocess.run(["python3", "/app/merge_config.py", *files], capture_output=True, text=True,
                          timeout=20, env=e, cwd="/tmp")


def write(tmp_path, name, obj):
    p = tmp_path / name
    p.write_text(obj if isinstance(obj, str) else json.dumps(obj))
    return str(p)


def test_example_files():
    out = run(["/app/config/base.json", "/app/config/production.json"])
    assert out.returncode == 0, out.stderr
    want = {"admins": ["ops@example.com"],
            "database": {"host": "db.internal", "options": {"sslmode": "require", "timeout": 5}, "port": 5432},
            "features": ["invoices"], "service": {"debug": False, "name": "billing", "port": 80}}
    assert out.stdout == json.dumps(want, indent=2, sort_keys=True) + "\n"


def test_null_removes_and_type_replacement(tmp_path):
    a = write(tmp_path, "a.json", {"x": {"y": 1, "z": 2}, "keep": None, "l": [1, 2], "o": {"p": 1}, "s": "t"})
    b = write(tmp_path, "b.json", {"x": {"z": None}, "l": [3], "o": 5, "s": {"u": 1}})
    c = write(tmp_path, "c.json", {"x": None, "gone": None})
    out = run([a, b])
    assert json.loads(out.stdout) == {"x": {"y": 1}, "keep": None, "l": [3], "o": 5, "s": {"u": 1}}
    out = run([a, b, c])
    assert json.loads(out.stdout) == {"keep": None, "l": [3], "o": 5, "s": {"u": 1}}


def test_env_overrides(tmp_path):
    a = write(tmp_path, "a.json", {"service": {"port": 8000, "name": "b"}, "db": "sqlite"})
    env = {"APP__SERVICE__PORT": "81", "APP__SERVICE__NAME": "billing-eu", "APP__FEATURES": '["a", "b"]',
           "APP__DB__HOST": "db1", "APP__NEW__DEEP__FLAG": "true", "APP__TEXT": "not json {",
           "APP__SERVICE__TAGS": "null", "OTHER__X": "1"}
    out = run([a], env)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == {
        "service": {"port": 81, "name": "billing-eu", "tags": None}, "features": ["a", "b"],
        "db": {"host": "db1"}, "new": {"deep": {"flag": True}}, "text": "not json {"}


def test_env_sorted_application(tmp_path):
    a = write(tmp_path, "a.json", {})
    out = run([a], {"APP__A": "1", "APP__A__B": "2"})
    assert json.loads(out.stdout) == {"a": {"b": 2}}


def test_errors(tmp_path):
    good = write(tmp_path, "good.json", {"a": 1})
    for bad in (str(tmp_path / "missing.json"), write(tmp_path, "bad.json", "{nope"),
                write(tmp_path, "list.json", [1, 2])):
        out = run([good, bad])
        assert out.returncode == 1, bad
        assert out.stdout == ""
        assert os.path.basename(bad) in out.stderr
