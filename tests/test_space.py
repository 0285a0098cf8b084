"""The Space end to end: `python space/app.py` on 127.0.0.1, driven with gradio_client and Debian's Chromium.

- replay of ReTerm-10K records, a Harbor job folder and a saved fan-out, through the app's API;
- live runs in the real local sandbox: the scripted oracle after a user-typed mistake (failure detected,
  sandbox forked into G attempts, each verified), SmolLM2 (slow), input errors shown as messages,
  Stop/cancel tearing every sandbox down;
- live mode off (with the sandbox's own reason) when the process lacks CAP_SYS_ADMIN, as on a Space;
- a browser test: load the page, run a replay, expand the failure step, screenshot (kept under
  test-output/space/ for people to look at).
"""

from __future__ import annotations

import json
import os
import queue
import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from sandbox_support import run_dirs_of

REPO = Path(__file__).resolve().parents[1]
APP = REPO / "space" / "app.py"
RECORDS = REPO / "tests" / "fixtures" / "reterm10k_mini"
JOBS = REPO / "tests" / "fixtures" / "jobs" / "demo"
FIXTURE_TASKS = REPO / "tests" / "fixtures" / "tasks"
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]  # fmt: skip


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """`python space/app.py` in a subprocess; ``url`` once it printed its address."""

    def __init__(self, args: list[str], prefix: list[str] | None = None, env: dict[str, str] | None = None,
                 app: Path = APP, cwd: Path = REPO) -> None:  # fmt: skip
        self.port = _free_port()
        cmd = [*(prefix or []), sys.executable, str(app), "--host", "127.0.0.1", "--port", str(self.port), *args]
        self.proc = subprocess.Popen(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                     env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})})  # fmt: skip
        self.lines: queue.Queue[str] = queue.Queue()
        self.log: list[str] = []
        threading.Thread(target=self._pump, daemon=True).start()
        self.url = self._wait_url(timeout_s=180)

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.log.append(line)
            self.lines.put(line)

    def _wait_url(self, timeout_s: float) -> str:
        end = time.monotonic() + timeout_s
        while time.monotonic() < end:
            try:
                line = self.lines.get(timeout=1)
            except queue.Empty:
                if self.proc.poll() is not None:
                    break
                continue
            if line.startswith("ReTerm Space running on "):
                return line.split(" on ", 1)[1].strip()
        self.stop()
        raise AssertionError("the app did not start:\n" + "".join(self.log[-40:]))

    @property
    def pid(self) -> int:
        return self.proc.pid

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


@pytest.fixture(scope="module")
def runs_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("space-runs")


@pytest.fixture(scope="module")
def silent_hub():
    """A Hub endpoint that accepts connections and never answers (a hanging network)."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    sock.close()


@pytest.fixture(scope="module")
def server(runs_dir, silent_hub, tmp_path_factory):
    home = tmp_path_factory.mktemp("hf-home")  # an empty Hub cache
    srv = Server(["--tasks", str(FIXTURE_TASKS), "--tasks", str(REPO / "tasks"), "--runs-dir", str(runs_dir),
                  "--source", str(RECORDS), "--source", str(JOBS), "--source", str(runs_dir)],
                 env={"HF_ENDPOINT": silent_hub, "HF_HOME": str(home)})  # fmt: skip
    yield srv
    srv.stop()
    assert run_dirs_of(srv.pid) == [], "the app left sandboxes behind"


@pytest.fixture(scope="module")
def harbor_jobs(tmp_path_factory) -> Path:
    """The folder `harbor run -o DIR` writes (DIR/<job>/<trial>/...): the oracle on a fixture task."""
    out = tmp_path_factory.mktemp("harbor") / "jobs"
    args = [str(Path(sys.executable).parent / "harbor"), "run", "-p", str(FIXTURE_TASKS / "hello-file"),
            "-a", "reterm.agent.harbor:ReTermAgent", "-e", "reterm.sandbox.local:LocalEnvironment",
            "--ak", "policy=oracle", "-o", str(out), "-y"]  # fmt: skip
    proc = subprocess.run(args, capture_output=True, text=True, cwd=out.parent, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(REPO)})  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return out


@pytest.fixture()
def client(server):
    from gradio_client import Client

    return Client(server.url, verbose=False)


def _live_args(task="hello-file", model="oracle", forks=3, first="", max_turns=5, recovery_turns=5, tokens=128, **kw):
    """The /live endpoint's positional inputs (order of the Run button's inputs in app.py)."""
    return (task, kw.get("folder", ""), kw.get("instruction", ""), model, kw.get("checkpoint", ""), kw.get("base_url", ""),
            kw.get("served", ""), forks, max_turns, recovery_turns, kw.get("temperature", 0.7), tokens, first)  # fmt: skip


def _sandbox_processes(marker: bytes) -> list[int]:
    """Pids whose command line is exactly ``marker`` (NUL-separated argv, e.g. b"sleep\\x0027.25\\x00")."""
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if (d / "cmdline").read_bytes() == marker:
                    out.append(int(d.name))
            except OSError:
                pass
    return out


# ===================================================================================== replay
def test_replay_records(client):
    items, categories, info = client.predict(str(RECORDS), "all", api_name="/open_source")
    keys = [c[1] for c in items["choices"]]
    assert len(keys) == 24 and items["value"] == keys[0]
    assert "missing_dependency" in [c[1] for c in categories["choices"]]
    assert "24 in 2 split(s)" in info
    html, data = client.predict(str(RECORDS), "train:0", False, api_name="/show_item")
    assert data["failure_step"] == 1 and data["failure_category"] == "missing_dependency"
    assert data["recovery_from"] == 2 and data["reward"] == 1.0
    assert data["steps"][1]["exit_status"] == 1 and "pandas" in data["steps"][1]["command"]
    assert 'class="rt-step rt-failure"' in html and "rt-term" in html and "recovery from the failure state" in html
    only, _, _ = client.predict(str(RECORDS), "faulty_implementation", api_name="/open_source")
    assert 0 < len(only["choices"]) < 24 and all("faulty_implementation" in c[0] for c in only["choices"])


def test_replay_job_folder(client):
    items, _, info = client.predict(str(JOBS), "all", api_name="/open_source")
    assert "Harbor job" in info and "task-a__demo0" in [c[1] for c in items["choices"]]
    html, data = client.predict(str(JOBS), "task-a__demo0", True, api_name="/show_item")
    assert data["failure_category"] == "missing_dependency" and data["failure_step"] == 0 and data["outcome"] == "success"
    assert html.count("<details") >= len(data["steps"]) and " open>" in html  # expand all steps


def test_replay_bad_source_is_a_message(client):
    from gradio_client.exceptions import AppError

    with pytest.raises(AppError, match="no such file or folder, and not a Hub dataset id"):
        client.predict("/no/such/folder", "all", api_name="/open_source")


def test_replay_unreachable_hub_fails_fast(client, silent_hub):
    from gradio_client.exceptions import AppError

    start = time.monotonic()
    with pytest.raises(AppError, match=rf"org/unreachable: .*{silent_hub} did not answer within 3 s.*no copy"):
        client.predict("org/unreachable", "all", api_name="/open_source")
    assert time.monotonic() - start < 5


def test_replay_harbor_run_output_folder(client, harbor_jobs):
    items, _, info = client.predict(str(harbor_jobs), "all", api_name="/open_source")
    assert "Harbor job: 1 trials with a trajectory (1 passed)" in info, info
    (key,) = [c[1] for c in items["choices"]]
    _, data = client.predict(str(harbor_jobs), key, False, api_name="/show_item")
    assert data["outcome"] == "success" and data["steps"][0]["command"] == 'echo "Hello, world!" > /app/hello.txt'


# ======================================================================================= live
def test_live_oracle_forks_at_the_failure_and_verifies(client, server, runs_dir):
    job = client.submit(*_live_args(first="cat /app/missing.txt", forks=3), api_name="/live")
    status, main_html, attempts_html, summary = job.result(timeout=240)
    outputs = job.outputs()
    assert len(outputs) >= 5, "the run was not streamed step by step"
    phases = [o[0] for o in outputs]
    assert any("typing the user's first command" in p for p in phases)
    assert any("recovery attempts running" in p or "forking" in p for p in phases)
    assert summary["status"] == "done", summary
    assert summary["main"]["commands"] == ["cat /app/missing.txt"] and summary["main"]["injected"] == [0]
    assert summary["failure"]["category"] == "path_permission" and summary["failure"]["step"] == 0
    assert len(summary["failure"]["id"]) == 16  # reterm.recovery.state.state_id, as in the dataset, GRPO, the eval
    assert len(summary["attempts"]) == 3 and all(a["reward"] == 1.0 for a in summary["attempts"])
    assert all(a["commands"] == ['echo "Hello, world!" > /app/hello.txt'] for a in summary["attempts"])
    assert summary["fork_s"] > 0
    # saved as it goes: the run folder exists while it is still running
    assert any(o[3].get("status") == "running" and o[3].get("run_dir") for o in outputs), "not saved before the end"
    turns = [text for _, text in summary["timeline"] if text.startswith("attempt ")]
    assert sorted(t.split(" · ")[0] for t in turns) == [f"attempt {k} turn {n}/5" for k in (1, 2, 3) for n in (1, 2)]
    assert all(t.endswith(" s · submit") or t.endswith(' s · $ echo "Hello, world!" > /app/hello.txt') for t in turns)
    assert "3 of 3 scored attempts recovered" in attempts_html and 'class="rt-step rt-failure"' in main_html
    assert run_dirs_of(server.pid) == [], "sandboxes left after the run"
    # the saved run replays as a fan-out
    run = Path(summary["run_dir"])
    assert run.parent == runs_dir and (run / "main.json").is_file() and len(list((run / "attempts").glob("*.json"))) == 3
    saved = [json.loads(p.read_text()) for p in sorted((run / "attempts").glob("*.json"))]
    assert {t["metadata"]["failure_state"] for t in saved} == {summary["failure"]["id"]}  # named by its state_id
    items, _, _ = client.predict(str(runs_dir), "all", api_name="/open_source")
    group = next(c[1] for c in items["choices"] if "fan-out of 3" in c[0])
    html, data = client.predict(str(runs_dir), group, False, api_name="/show_item")
    assert data["kind"] == "fanout" and [a["reward"] for a in data["attempts"]] == [1.0, 1.0, 1.0]
    assert data["failure_category"] == "path_permission" and html.count('class="rt-col ') == 3


def test_live_without_failure_runs_the_verifier_only(client, server):
    summary = client.predict(*_live_args(forks=2), api_name="/live")[3]
    assert summary["status"] == "done" and summary["failure"] is None and summary["attempts"] == []
    assert summary["main"]["outcome"] == "success" and summary["main"]["reward"] == 1.0
    assert "nothing to recover from" in summary["phase"]
    assert run_dirs_of(server.pid) == []


def test_live_without_forks_lets_the_agent_continue(client, server):
    summary = client.predict(*_live_args(first="cat /app/missing.txt", forks=0), api_name="/live")[3]
    assert summary["failure"]["category"] == "path_permission" and summary["attempts"] == []
    assert summary["main"]["commands"] == ["cat /app/missing.txt", 'echo "Hello, world!" > /app/hello.txt']
    assert summary["main"]["reward"] == 1.0 and "recovered by itself" in summary["phase"]
    turns = [text for _, text in summary["timeline"] if text.startswith("turn ")]
    assert turns[0].startswith("turn 1/5 · ") and turns[0].endswith(' s · $ echo "Hello, world!" > /app/hello.txt')
    assert turns[1].startswith("turn 2/5 · ") and turns[1].endswith(" s · submit")
    assert run_dirs_of(server.pid) == []


def test_live_input_errors_are_messages(client):
    from gradio_client.exceptions import AppError

    with pytest.raises(AppError, match="unknown task 'no-such-task'"):
        client.predict(*_live_args(task="no-such-task"), api_name="/live")
    with pytest.raises(AppError, match="cannot reach the endpoint http://127.0.0.1:9/v1"):
        client.predict(*_live_args(model="endpoint", base_url="http://127.0.0.1:9/v1", served="m"), api_name="/live")
    with pytest.raises(AppError, match="instruction is empty"):
        client.predict(*_live_args(task="", folder=str(FIXTURE_TASKS / "hello-file"), instruction="  "), api_name="/live")
    with pytest.raises(AppError, match="greater than maximum value 8"):  # the fork cap (Gradio's slider check)
        client.predict(*_live_args(forks=50), api_name="/live")


def test_live_cancel_tears_down_the_sandbox(client, server):
    job = client.submit(*_live_args(first="sleep 27.25", forks=2), api_name="/live")
    marker = b"sleep\x0027.25\x00"
    end = time.monotonic() + 60
    while time.monotonic() < end and not (_sandbox_processes(marker) and run_dirs_of(server.pid)):
        time.sleep(0.2)
    assert _sandbox_processes(marker) and run_dirs_of(server.pid), "the command never started in a sandbox"
    job.cancel()
    end = time.monotonic() + 20
    while time.monotonic() < end and (run_dirs_of(server.pid) or _sandbox_processes(marker)):
        time.sleep(0.2)
    assert run_dirs_of(server.pid) == [], "sandbox folder left after cancel"
    assert _sandbox_processes(marker) == [], "the sandbox's command still runs after cancel"


@pytest.mark.slow
def test_live_smollm2(client, server):
    job = client.submit(*_live_args(model="smollm2", first="cat /app/missing.txt", forks=2, max_turns=1,
                                    recovery_turns=1, tokens=32), api_name="/live")  # fmt: skip
    summary = job.result(timeout=900)[3]
    assert summary["status"] == "done" and summary["policy"] == "smollm2", summary
    assert summary["failure"]["category"] == "path_permission"
    assert len(summary["attempts"]) == 2
    for a in summary["attempts"]:  # SmolLM2 rarely recovers; what matters: scored, not an infrastructure fault
        assert a["outcome"] in ("success", "failure") and a["steps"] == 1
    assert run_dirs_of(server.pid) == []


# ======================================================================== no sandbox, no live
def test_live_off_without_privileges(tmp_path):
    """As on a Space: without CAP_SYS_ADMIN the sandbox's own check turns live mode off; replay works."""
    from gradio_client import Client
    from gradio_client.exceptions import AppError

    setpriv = shutil.which("setpriv")
    if setpriv is None or os.geteuid() != 0:
        pytest.skip("needs root and util-linux setpriv to drop CAP_SYS_ADMIN")
    srv = Server(["--tasks", str(FIXTURE_TASKS), "--source", str(RECORDS), "--runs-dir", str(tmp_path)],
                 prefix=[setpriv, "--bounding-set", "-sys_admin", "--inh-caps", "-sys_admin", "--"])  # fmt: skip
    try:
        assert any("live mode: off" in line and "CAP_SYS_ADMIN" in line for line in srv.log)
        c = Client(srv.url, verbose=False)
        with pytest.raises(AppError, match="needs CAP_SYS_ADMIN"):
            c.predict(*_live_args(), api_name="/live")
        _, data = c.predict(str(RECORDS), "train:1", False, api_name="/show_item")
        assert data["failure_step"] is not None
    finally:
        srv.stop()


# ==================================================================================== browser
def test_browser_replay_expands_the_failure_step(server, tmp_path):
    from playwright.sync_api import expect, sync_playwright

    if not Path(CHROMIUM).is_file():
        pytest.fail(f"{CHROMIUM} missing: scripts/setup.sh installs Debian's chromium")
    # a trajectory whose output must show literally (HTML and template syntax in terminal output)
    from reterm.trajectory import Action, Step, Trajectory

    tricky = tmp_path / "tricky"
    out = "<b>not bold</b> ${HOME} {{user}} `ls`"
    Trajectory(task_id="tricky", instruction="echo things", system_prompt="",
               steps=[Step(index=0, model_text="", action=Action(tool="bash", command="printf '%s' \"$X\""),
                           observation=f"{out}\n[exit status: 0]", exit_status=0)]).save(tricky / "t.json")  # fmt: skip

    shots = REPO / "test-output" / "space"
    shots.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 1000})
            page.goto(server.url)
            expect(page.get_by_role("heading", name="ReTerm · recovery, step by step")).to_be_visible(timeout=60_000)
            view = page.locator("#replay-view")
            expect(view.locator(".rt-step").first).to_be_visible(timeout=60_000)  # first record shown on load
            first_title = view.locator(".rt-title").inner_text()
            page.get_by_role("button", name="next ▶").click()  # replay the next record
            expect(view.locator(".rt-title")).not_to_have_text(first_title, timeout=30_000)
            page.wait_for_timeout(800)  # let the HTML component settle (it may render the new value twice)
            failure = view.locator("details.rt-failure")
            expect(failure).to_have_count(1)
            expect(failure.locator(".rt-term-body")).to_be_hidden()
            failure.locator("summary").click()
            expect(failure).to_have_attribute("open", "")
            expect(failure.locator(".rt-term-body")).to_be_visible()
            expect(failure.locator("summary")).to_contain_text("failure")
            assert failure.locator(".rt-status").inner_text().startswith("[exit status:")
            page.wait_for_timeout(300)
            page.screenshot(path=str(tmp_path / "replay.png"), full_page=True)
            shutil.copy(tmp_path / "replay.png", shots / "replay.png")
            assert (tmp_path / "replay.png").stat().st_size > 20_000

            # terminal output is shown as text, never interpreted
            source = page.get_by_label("Source")
            source.fill(str(tricky))
            source.press("Enter")
            page.get_by_role("button", name="Open").click()
            step = view.locator("details.rt-step").first
            expect(step.locator("summary")).to_contain_text("printf")
            page.wait_for_timeout(800)
            step.locator("summary").click()
            expect(step.locator(".rt-term-body")).to_contain_text(out)
            assert view.locator("b", has_text="not bold").count() == 0
        finally:
            browser.close()


def _browser(p):
    if not Path(CHROMIUM).is_file():
        pytest.fail(f"{CHROMIUM} missing: scripts/setup.sh installs Debian's chromium")
    return p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)


def _open_source(page, spec: str) -> None:
    source = page.get_by_label("Source")
    source.fill(spec)
    source.press("Enter")
    page.get_by_role("button", name="Open").click()


def test_browser_opens_a_harbor_job_folder_and_an_unreachable_hub_fails_fast(server, harbor_jobs):
    from playwright.sync_api import expect, sync_playwright

    with sync_playwright() as p:
        browser = _browser(p)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 1000})
            page.goto(server.url)
            view = page.locator("#replay-view")
            expect(view.locator(".rt-step").first).to_be_visible(timeout=60_000)
            _open_source(page, str(harbor_jobs))
            expect(view.locator("details.rt-step").first.locator("summary")).to_contain_text("Hello, world!",
                                                                                            timeout=30_000)  # fmt: skip
            start = time.monotonic()
            _open_source(page, "org/unreachable")
            expect(page.get_by_text("org/unreachable could not be opened")).to_be_visible(timeout=5_000)
            assert time.monotonic() - start < 5
            expect(page.get_by_text("did not answer within 3 s").first).to_be_visible()  # the error's own message
            expect(view.locator(".rt-step")).to_have_count(0)  # the previous source's trajectory is gone
        finally:
            browser.close()


def test_browser_closing_the_tab_stops_the_live_run(server):
    from playwright.sync_api import expect, sync_playwright

    marker = b"sleep\x0029.75\x00"
    with sync_playwright() as p:
        browser = _browser(p)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 1000})
            page.goto(server.url)
            expect(page.get_by_role("heading", name="ReTerm · recovery, step by step")).to_be_visible(timeout=60_000)
            page.get_by_role("tab", name="Live").click()
            page.get_by_label("Model").click()
            page.get_by_role("option", name="scripted oracle").click()
            page.get_by_label("Start with a mistake (optional)").fill("sleep 29.75")
            page.get_by_role("button", name="▶ Run").click()
            end = time.monotonic() + 60
            while time.monotonic() < end and not (_sandbox_processes(marker) and run_dirs_of(server.pid)):
                time.sleep(0.2)
            assert _sandbox_processes(marker), "the command never started in a sandbox"
            page.close()  # the browser session ends; nobody presses Stop
            end = time.monotonic() + 20
            while time.monotonic() < end and (run_dirs_of(server.pid) or _sandbox_processes(marker)):
                time.sleep(0.2)
            assert run_dirs_of(server.pid) == [], "sandbox left after the tab was closed"
            assert _sandbox_processes(marker) == [], "the run went on after the tab was closed"
        finally:
            browser.close()


def test_browser_fresh_clone_opens_on_a_models_recovery_attempts(tmp_path):
    """A checkout with no run (``space/`` copied alone), started with the plain command: the first screen is the
    bundled recording of a trained checkpoint's own failure and its forked recovery attempts (not the scripted
    oracle), under a checkout-relative source name; no absolute path of the machine is on the page."""
    from playwright.sync_api import expect, sync_playwright

    from reterm.trajectory import Outcome, Trajectory

    examples = REPO / "space" / "examples" / "model-recoveries"
    cases = sorted(p for p in examples.iterdir() if (p / "main.json").is_file())
    assert cases, f"{examples}: no recorded model run"
    attempts = [Trajectory.load(f) for f in sorted((cases[0] / "attempts").glob("*.json"))]
    main = Trajectory.load(cases[0] / "main.json")
    model = main.policy
    assert model not in ("oracle", "user") and "/" not in model and attempts
    assert {a.policy for a in attempts} == {model}  # the model's own attempts
    category = attempts[0].metadata["failure_category"]  # the failure the sandbox was forked at
    assert category and attempts[0].prefix_len > 0
    recovered = sum(a.outcome is Outcome.SUCCESS for a in attempts)
    scored = sum(a.outcome in (Outcome.SUCCESS, Outcome.FAILURE) for a in attempts)
    assert recovered >= 1, f"{cases[0].name}: the first screen's recording has no recovering attempt"

    clone = tmp_path / "clone"
    shutil.copytree(REPO / "space", clone / "space", ignore=shutil.ignore_patterns("__pycache__"))
    srv = Server(["--runs-dir", str(tmp_path / "no-runs")], app=clone / "space" / "app.py", cwd=clone,
                 env={"PYTHONPATH": str(REPO)})  # fmt: skip
    shots = REPO / "test-output" / "space"
    shots.mkdir(parents=True, exist_ok=True)
    try:
        with sync_playwright() as p:
            browser = _browser(p)
            try:
                page = browser.new_page(viewport={"width": 1400, "height": 1100})
                page.goto(srv.url)
                view = page.locator("#replay-view")
                expect(view.locator(".rt-step").first).to_be_visible(timeout=60_000)
                assert page.get_by_label("Source").input_value() == "space/examples/model-recoveries"
                expect(view.locator(".rt-title").first).to_contain_text(main.task_id)
                expect(view).to_contain_text(f"recovery policy {model}")
                expect(view.locator(".rt-failure").first).to_be_visible()
                expect(view.locator(".rt-fan-head")).to_contain_text(f"{recovered} of {scored} scored attempts recovered")
                expect(view.locator(".rt-col.rt-col-pass")).to_have_count(recovered)
                expect(view.locator(".rt-col.rt-col-fail")).to_have_count(scored - recovered)
                page.wait_for_timeout(500)
                page.screenshot(path=str(shots / "first-screen.png"), full_page=True)
                html = page.content()
                assert str(clone) not in html and str(REPO) not in html and str(Path.home() / ".cache") not in html
            finally:
                browser.close()
    finally:
        srv.stop()
