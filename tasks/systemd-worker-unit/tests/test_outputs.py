"""Outcome checks: unit file directives (systemd.unit/systemd.service semantics) and the enable symlink."""
import os

UNIT = "/etc/systemd/system/queue-worker.service"


def parse(path):
    sections, current = {}, None
    with open(path) as fh:
        lines = fh.read().replace("\\\n", " ").splitlines()
    for raw in lines:
        line = raw.strip()
        if not line or line[0] in "#;":
            continue
        if line.startswith("[") and line.endswith("]"):
            current = sections.setdefault(line[1:-1], {})
            continue
        key, _, value = line.partition("=")
        current.setdefault(key.strip(), []).append(value.strip())
    return sections


def words(values):
    return [w for v in values for w in v.split()]


def test_unit_section():
    u = parse(UNIT)["Unit"]
    assert u["Description"][-1] == "Queue worker for outgoing e-mails"
    assert "network-online.target" in words(u.get("After", []))
    assert "network-online.target" in words(u.get("Wants", []))


def test_service_section():
    s = parse(UNIT)["Service"]
    assert s["ExecStart"][-1].split() == ["/usr/bin/python3", "/opt/worker/worker.py", "--queue", "emails"]
    assert s["User"][-1] == "worker" and s["Group"][-1] == "worker"
    assert s["WorkingDirectory"][-1] == "/opt/worker"
    assert [v.lstrip("-") for v in s["EnvironmentFile"]] == ["/etc/worker/worker.env"]
    assert s["Restart"][-1] == "on-failure"
    assert s["RestartSec"][-1] in ("5", "5s", "5sec")
    assert s.get("Type", ["simple"])[-1] in ("simple", "exec")


def test_enabled():
    assert "multi-user.target" in words(parse(UNIT)["Install"]["WantedBy"])
    link = "/etc/systemd/system/multi-user.target.wants/queue-worker.service"
    assert os.path.islink(link)
    assert os.path.realpath(link) == UNIT
