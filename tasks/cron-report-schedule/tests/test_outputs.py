"""Outcome checks: /etc/cron.d/reports fires each job at exactly the requested minutes of a year.

The cron expression semantics (ranges, steps, lists, names, day-of-month OR day-of-week when both are
restricted, 0 and 7 = Sunday) follow crontab(5).
"""
import datetime
import os
import re
import stat

PATH = "/etc/cron.d/reports"
NAMES = {**{m: i + 1 for i, m in enumerate("jan feb mar apr may jun jul aug sep oct nov dec".split())},
         **{d: i for i, d in enumerate("sun mon tue wed thu fri sat".split())}}


def expand(field, lo, hi):
    values = set()
    for part in field.lower().split(","):
        rng, slash, step = part.partition("/")
        step = int(step) if step else 1
        if rng == "*":
            a, b = lo, hi
        elif "-" in rng:
            a, b = (int(NAMES.get(x, x)) for x in rng.split("-"))
        else:
            a = int(NAMES.get(rng, rng))
            b = hi if slash else a
        values.update(range(a, b + 1, step))
    return values


def parse():
    env, jobs = {}, {}
    with open(PATH) as fh:
        for raw in fh:
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            m = re.match(r"^([A-Za-z_][A-Za-z0-9_]*)\s*=\s*(.*)$", line)
            if m and len(line.split()) < 7:
                env[m.group(1)] = m.group(2).strip().strip('"').strip("'")
                continue
            fields = line.split(None, 6)
            assert len(fields) == 7, f"bad line: {line!r}"
            jobs[fields[6].strip()] = fields
    return env, jobs


def fires(fields, when):
    minute, hour, dom, mon, dow, *_ = fields
    dows = {d % 7 for d in expand(dow, 0, 7)}
    dom_set, cron_dow = expand(dom, 1, 31), (when.isoweekday() % 7)
    if not (when.minute in expand(minute, 0, 59) and when.hour in expand(hour, 0, 23)
            and when.month in expand(mon, 1, 12)):
        return False
    if dom != "*" and dow != "*":
        return when.day in dom_set or cron_dow in dows
    return when.day in dom_set and cron_dow in dows


def minutes_of_2024(fields):
    got, t = set(), datetime.datetime(2024, 1, 1)
    # only minutes 0..59 of each hour matter; iterate hours and test the minute set directly
    mins, hours = expand(fields[0], 0, 59), expand(fields[1], 0, 23)
    while t.year == 2024:
        if t.hour in hours:
            for m in mins:
                cand = t.replace(minute=m)
                if fires(fields, cand):
                    got.add(cand)
        t += datetime.timedelta(hours=1)
    return got


def want(pred):
    out, t = set(), datetime.datetime(2024, 1, 1)
    while t.year == 2024:
        if pred(t):
            out.add(t)
        t += datetime.timedelta(minutes=1)
    return out


def test_file_mode_and_name():
    st = os.stat(PATH)
    assert st.st_uid == 0
    assert not stat.S_IMODE(st.st_mode) & 0o022


def test_no_mail():
    env, _ = parse()
    assert "MAILTO" in env and env["MAILTO"] == ""


def test_jobs_and_user():
    _, jobs = parse()
    assert set(jobs) == {"/opt/reports/daily.sh", "/opt/reports/sync.sh", "/opt/reports/monthly.sh"}
    assert all(f[5] == "reports" for f in jobs.values())


def test_schedules():
    _, jobs = parse()
    assert minutes_of_2024(jobs["/opt/reports/daily.sh"]) == want(
        lambda t: t.weekday() < 5 and (t.hour, t.minute) == (2, 30))
    assert minutes_of_2024(jobs["/opt/reports/sync.sh"]) == want(
        lambda t: 8 <= t.hour <= 18 and t.minute % 15 == 0)
    assert minutes_of_2024(jobs["/opt/reports/monthly.sh"]) == want(
        lambda t: t.day == 1 and (t.hour, t.minute) == (4, 0))
