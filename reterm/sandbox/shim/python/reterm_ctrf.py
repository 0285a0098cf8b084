"""pytest plugin of the reterm offline shim: ``--ctrf FILE`` writes a CTRF JSON report.

Own code standing in for the pytest-json-ctrf package (which Terminal-Bench verifiers request through
uvx) so its command-line option works offline. Report layout: the Common Test Report Format
(https://ctrf.io): ``results.tool``, ``results.summary`` (counts, start/stop in ms), ``results.tests``.
It does not influence pytest's exit status.
"""
import importlib.metadata
import json
import os
import time


def _real_plugin_installed():
    """True when the real pytest-json-ctrf is installed (pip with a network): its pytest11 entry point
    (module ``ctrf.main``) gives --ctrf itself, and this plugin must then stand aside (two --ctrf options
    make pytest's argument parser fail)."""
    try:
        importlib.metadata.distribution("pytest-json-ctrf")
        return True
    except importlib.metadata.PackageNotFoundError:
        return False


_REAL = _real_plugin_installed()


def pytest_addoption(parser):
    if _REAL:
        return
    parser.addoption("--ctrf", action="store", default=None, metavar="FILE",
                     help="write a CTRF JSON report to FILE (reterm offline shim)")


def pytest_configure(config):
    if _REAL:
        return
    path = config.getoption("--ctrf")
    if path:
        config.pluginmanager.register(_Report(path), "reterm-ctrf-report")


class _Report:
    def __init__(self, path):
        self.path, self.tests, self.start = path, [], int(time.time() * 1000)

    def pytest_runtest_logreport(self, report):
        if report.when == "call" or (report.when == "setup" and report.outcome != "passed"):
            status = {"passed": "passed", "failed": "failed", "skipped": "skipped"}[report.outcome]
            test = {"name": report.nodeid, "status": status, "duration": int(getattr(report, "duration", 0) * 1000)}
            if report.failed:  # CTRF's message: the end of the failure's text (what a harness reads to tell why)
                test["message"] = str(report.longrepr)[-2000:]
            self.tests.append(test)

    def pytest_sessionfinish(self, session):
        counts = {s: sum(t["status"] == s for t in self.tests) for s in ("passed", "failed", "skipped")}
        summary = {"tests": len(self.tests), **counts, "pending": 0, "other": 0,
                   "start": self.start, "stop": int(time.time() * 1000)}
        doc = {"results": {"tool": {"name": "pytest"}, "summary": summary, "tests": self.tests}}
        os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
        with open(self.path, "w") as fh:
            json.dump(doc, fh, indent=2)
