"""Outcome checks: the exact file set after retention, compressed contents intact, rest untouched."""
import datetime
import gzip
import os

ROOT = "/var/log/myapp"


def _content(kind, day):
    return "".join(f"{day} {kind} line {i}\n" for i in range(40))


def _expected():
    want = {"current.log": "live log\n",
            "archive/app-2023-12-31.log": "archived app-2023-12-31.log\n",
            "archive/app-2024-01-15.log": "archived app-2024-01-15.log\n"}
    day = datetime.date(2024, 2, 25)
    while day <= datetime.date(2024, 3, 20):
        for kind in ("app", "error"):
            name = f"{kind}-{day.isoformat()}.log"
            if day < datetime.date(2024, 3, 6):
                pass
            elif day <= datetime.date(2024, 3, 18):
                want[name + ".gz"] = _content(kind, day)
            else:
                want[name] = _content(kind, day)
        day += datetime.timedelta(days=1)
    return want


def _files():
    got = []
    for dirpath, _dirs, files in os.walk(ROOT):
        got += [os.path.relpath(os.path.join(dirpath, f), ROOT) for f in files]
    return sorted(got)


def test_file_set():
    assert _files() == sorted(_expected())


def test_contents():
    for rel, text in _expected().items():
        path = os.path.join(ROOT, rel)
        if rel.endswith(".gz"):
            with gzip.open(path, "rt") as fh:
                assert fh.read() == text, rel
        else:
            with open(path) as fh:
                assert fh.read() == text, rel
