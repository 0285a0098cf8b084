"""Terminal-Bench 2.0 behaviour of the local sandbox (issue 33), through Harbor's own Trial on the real sandbox:
localhost resolves as in Docker; a verifier that needs a host the sandbox cannot reach ends as an
infrastructure fault naming the host, which the evaluation's Pass@1 leaves out of its denominator; the
offline verifier shim applies in Harbor trials; the unreachable-host reader and the DNS recorder's parser."""

from __future__ import annotations

import asyncio
import json
import struct
import textwrap
from pathlib import Path

import pytest

from reterm.eval.metrics import load_job, pass_at_1, summarize, task_counts
from reterm.sandbox.local import LocalEnvironment
from reterm.sandbox.network import parse_query, refused_answer, unreachable_hosts
from reterm.tasks import load_task
from reterm.tasks.verify import run_trial
from reterm.trajectory import Outcome


def make_task(root: Path, *, test_sh: str, solve_sh: str, dockerfile: str = "FROM debian:bookworm-slim\nWORKDIR /app\n",
              toml: str = "") -> Path:  # fmt: skip
    """A Harbor task folder (Terminal-Bench 2.0 layout) with the given scripts."""
    for d in ("environment", "tests", "solution"):
        (root / d).mkdir(parents=True)
    (root / "task.toml").write_text('version = "1.0"\n[verifier]\ntimeout_sec = 120.0\n[agent]\ntimeout_sec = 120.0\n'
                                    + toml)  # fmt: skip
    (root / "instruction.md").write_text("Write the page.\n")
    (root / "environment" / "Dockerfile").write_text(dockerfile)
    (root / "tests" / "test.sh").write_text("#!/bin/bash\n" + textwrap.dedent(test_sh))
    (root / "solution" / "solve.sh").write_text("#!/bin/bash\n" + textwrap.dedent(solve_sh))
    return root


# The test serves /app over HTTP on localhost and fetches the page through the name (getaddrinfo, /etc/hosts).
LOCALHOST_TEST = """
    cd /app && python3 -m http.server 8931 --bind localhost >/tmp/http.log 2>&1 &
    python3 - <<'EOF'
    import time, urllib.request
    for _ in range(100):
        try:
            body = urllib.request.urlopen("http://localhost:8931/page.html", timeout=2).read().decode()
            break
        except OSError:
            time.sleep(0.1)
    else:
        body = ""
    ok = body.strip() == "hello from localhost"
    open("/logs/verifier/reward.txt", "w").write("1" if ok else "0")
    EOF
"""


def harbor_result_of(out) -> dict:
    """Harbor's own result.json of a trial (what ``harbor view`` reads)."""
    return json.loads((Path(out.trial_dir) / "result.json").read_text())


def trial(task: Path, agent: str, trials: Path, **ek):
    return asyncio.run(run_trial(load_task(task), agent, trials, environment_kwargs=ek))


def test_localhost_server_task_passes_in_the_sandbox(tmp_path):
    task = make_task(tmp_path / "localhost-page", test_sh=LOCALHOST_TEST,
                     solve_sh="echo 'hello from localhost' > /app/page.html\n")  # fmt: skip
    oracle = trial(task, "oracle", tmp_path / "trials")
    nop = trial(task, "nop", tmp_path / "trials")
    assert (oracle.reward, oracle.error) == (1.0, None), oracle
    assert (nop.reward, nop.error) == (0.0, None), nop


def test_sandbox_resolves_localhost_and_its_hostname_as_docker_does(tmp_path):
    async def body():
        env = LocalEnvironment.for_task(make_task(tmp_path / "t", test_sh="", solve_sh=""))
        async with env:
            r = await env.exec("python3 -c \"import socket as s; print(s.gethostbyname('localhost'), "
                               "s.gethostbyname(s.gethostname()), s.getaddrinfo('localhost', 80, s.AF_INET6)[0][4][0])\"; "
                               "getent hosts \"$(hostname)\"")  # fmt: skip
            assert r.return_code == 0, r
            lines = r.stdout.split("\n")
            assert lines[0] == "127.0.0.1 127.0.1.1 ::1" and lines[1].split() == ["127.0.1.1", "sandbox"], r
            # the file is the writable layer's: a task may add a name, and a fork keeps it
            await env.exec("echo '127.0.0.1 db.local' >> /etc/hosts")
            (fork,) = await env.fork(1)
            try:
                assert (await fork.exec("getent hosts db.local")).stdout.split()[0] == "127.0.0.1"
            finally:
                await fork.stop()

    asyncio.run(body())


@pytest.mark.slow  # five Harbor trials: 13 s quiet, 24 s under load on 2 cores
def test_verifier_that_needs_an_unreachable_host_is_an_infra_fault_left_out_of_pass_at_1(tmp_path):
    trials = tmp_path / "job"
    page = make_task(tmp_path / "localhost-page", test_sh=LOCALHOST_TEST,
                     solve_sh="echo 'hello from localhost' > /app/page.html\n")  # fmt: skip
    # a verifier that downloads a tool from a host this machine cannot reach, then scores 0 when it fails
    # (a Terminal-Bench 2.0 test.sh without the shim: nothing reports a problem, the reward is 0)
    needs_net = make_task(tmp_path / "needs-net", solve_sh="echo done > /app/out.txt\n", test_sh="""
        if curl -fsSL https://tools.unreachable-host.example/checker.sh -o /tmp/checker.sh; then
            bash /tmp/checker.sh && echo 1 > /logs/verifier/reward.txt && exit 0
        fi
        echo 0 > /logs/verifier/reward.txt
    """)
    for task, agent in ((page, "oracle"), (page, "nop"), (needs_net, "oracle"), (needs_net, "nop")):
        out = trial(task, agent, trials)
        harbor_result = harbor_result_of(out)
        if task is needs_net:
            assert out.reward is None and out.outcome == "network_error", out
            assert "verifier could not reach: tools.unreachable-host.example" in out.error, out
            # what `harbor run` / `harbor view` users read: a fault naming the host, no reward (no silent 0)
            exc = harbor_result["exception_info"]
            assert exc["exception_type"] == "NetworkUnreachableError", exc
            assert "verifier could not reach: tools.unreachable-host.example" in exc["exception_message"], exc
            assert harbor_result["verifier_result"] is None, harbor_result
        else:  # the agent's own outcome: scored as the verifier wrote it (nop: a failure of 0, no exception)
            assert harbor_result["exception_info"] is None, harbor_result
            want = 1.0 if agent == "oracle" else 0.0
            assert harbor_result["verifier_result"]["rewards"] == {"reward": want}, harbor_result
    job = load_job(trials)
    faults = [t for t in job.trials if t.outcome is Outcome.NETWORK_ERROR]
    assert len(faults) == 2 and {t.task for t in faults} == {"needs-net"}
    assert all(t.exception_type == "NetworkUnreachableError" and "tools.unreachable-host.example" in t.exception_message
               for t in faults)  # fmt: skip
    counts = task_counts(job.trials)
    assert counts == {"localhost-page": (2, 1), "needs-net": (0, 0)}  # no scored trial of the faulty task
    assert pass_at_1(counts).mean == 0.5 and pass_at_1(counts).n_tasks == 1
    report = summarize(job.trials)
    assert report["infra_faults"]["by_outcome"] == {"network_error": 2}
    # the same verifier in a task that forbids the network: its look-up is the task's business, scored as is
    # (an agent cannot turn its failure into a fault by making a no-network verifier reach out)
    forbidden = make_task(tmp_path / "no-net", solve_sh="echo done > /app/out.txt\n",
                          test_sh=(needs_net / "tests" / "test.sh").read_text(),
                          toml='[environment]\nnetwork_mode = "no-network"\n')  # fmt: skip
    out = trial(forbidden, "oracle", tmp_path / "other")
    assert (out.reward, out.outcome) == (0.0, "failure"), out
    harbor_result = harbor_result_of(out)
    assert harbor_result["exception_info"] is None and harbor_result["verifier_result"]["rewards"] == {"reward": 0.0}


def test_offline_shim_applies_in_harbor_trials(tmp_path):
    """A Terminal-Bench 2.0 test.sh (apt-get, uv's installer from astral.sh, then uvx pytest with the CTRF plugin)
    runs offline in a plain Harbor trial on the local sandbox: the sandbox applies the shim to the verifier only."""
    task = make_task(tmp_path / "tb2-style", solve_sh="echo 42 > /app/answer.txt\n", test_sh="""
        apt-get update
        apt-get install -y curl
        curl -sS -m 5 https://telemetry.unreachable-host.example/ping || true
        curl -LsSf https://astral.sh/uv/0.9.5/install.sh | sh
        source $HOME/.local/bin/env
        uvx -p 3.13 -w pytest==8.4.1 -w pytest-json-ctrf==0.3.5 pytest --ctrf /logs/verifier/ctrf.json /tests/test_outputs.py -rA
        if [ $? -eq 0 ]; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi
    """, dockerfile="FROM python:3.13-slim-bookworm\nWORKDIR /app\n")  # fmt: skip
    (task / "tests" / "test_outputs.py").write_text(
        "def test_answer():\n    assert open('/app/answer.txt').read().strip() == '42'\n"
    )
    oracle = trial(task, "oracle", tmp_path / "trials")
    assert (oracle.reward, oracle.error) == (1.0, None), oracle
    assert (Path(oracle.trial_dir) / "verifier" / "ctrf.json").is_file()
    nop = trial(task, "nop", tmp_path / "trials")
    # scored 0, not a network fault: the shim skips apt-get update offline, and the failed look-up of the
    # telemetry host did not decide the reward (the CTRF report shows the tests ran and why they failed)
    assert (nop.reward, nop.error, nop.outcome) == (0.0, None, "failure"), nop
    lookups = (Path(nop.trial_dir) / "reterm-network.jsonl").read_text()
    assert "telemetry.unreachable-host.example" in lookups and "deb.debian.org" not in lookups

    async def agent_view():
        env = LocalEnvironment.for_task(task)
        async with env:
            r = await env.exec("echo BASH_ENV=$BASH_ENV; command -v uvx || echo no-uvx")
            assert r.stdout == "BASH_ENV=\nno-uvx\n", r  # the agent phase has no shim on its PATH

    asyncio.run(agent_view())


@pytest.mark.parametrize(
    "text,hosts",
    [
        ("curl: (6) Could not resolve host: astral.sh", ["astral.sh"]),
        ("fatal: unable to access 'https://github.com/x/y/': Could not resolve host: github.com", ["github.com"]),
        ("Err:1 http://deb.debian.org/debian bookworm InRelease\n  Temporary failure resolving 'deb.debian.org'",
         ["deb.debian.org"]),
        ("WARNING: Retrying ... HTTPSConnectionPool(host='pypi.org', port=443): Max retries exceeded", ["pypi.org"]),
        ("npm ERR! request to https://registry.npmjs.org/x failed, reason: getaddrinfo ENOTFOUND registry.npmjs.org",
         ["registry.npmjs.org"]),
        ("curl: (7) Failed to connect to localhost port 8000 after 0 ms: Connection refused", []),
        ("all tests passed", []),
        # R: install.packages / download.file without a network
        ("Warning: unable to access index for repository https://cloud.r-project.org/src/contrib:\n"
         "  cannot open URL 'https://cloud.r-project.org/src/contrib/PACKAGES'", ["cloud.r-project.org"]),
        ("Error in download.file(url, destfile) : cannot open URL 'https://github.com/x/y.tar.gz'", ["github.com"]),
        ("URL 'https://cran.r-project.org/src/contrib/x.tar.gz': status was 'Couldn't resolve host name'",
         ["cran.r-project.org"]),
        # a test's own server on the wildcard address that never came up: not an unreachable host
        ("requests.exceptions.ConnectionError: HTTPConnectionPool(host='0.0.0.0', port=8080): Max retries exceeded "
         "(Caused by NewConnectionError('Failed to establish a new connection: [Errno 111] Connection refused'))", []),
        ("curl: (7) Failed to connect to 0.0.0.0 port 5000 after 0 ms: Couldn't connect to server", []),
        # opam quotes the curl command it ran (Terminal-Bench 2.0 compile-compcert, host network)
        ('[ERROR] Could not update repository "default": OpamDownload.Download_fail(_, "Curl failed: \\"/usr/bin/curl '
         '--write-out %{http_code}\\\\n --retry 3 -L -o /tmp/opam-781/index.tar.gz.part -- https://opam.ocaml.org/'
         'index.tar.gz\\" exited with code 6")', ["opam.ocaml.org"]),
        # pytest's traceback of urllib: the host in the frames' locals, the failure anonymous (filter-js-from-html)
        ("http_conn_args = {'check_hostname': None, 'context': None}, host = 'github.com'\n"
         "headers = {'Connection': 'close', 'Host': 'github.com', 'User-Agent': 'Python-urllib/3.11'}\n"
         "E       socket.gaierror: [Errno -2] Name or service not known", ["github.com"]),
        # add-apt-repository of a PPA when Launchpad's API is out of reach (rstan-to-pystan, host network)
        ("+ sudo add-apt-repository -y ppa:deadsnakes/ppa\nTraceback (most recent call last):\n"
         '  File "/usr/bin/add-apt-repository", line 362, in <module>\n'
         '  File "/usr/lib/python3/dist-packages/softwareproperties/ppa.py", line 113, in lpteam\n'
         "    self._lpteam = self.lp.people(self.teamname)\n"
         "AttributeError: 'NoneType' object has no attribute 'people'", ["api.launchpad.net"]),
        # ... but a frame's host with no failure is nobody's fault
        ("headers = {'Host': 'example.org'}\nE   assert 404 == 200", []),
    ],
)
def test_unreachable_hosts_from_error_messages(text, hosts):
    assert unreachable_hosts(text) == hosts


def test_dns_query_parse_and_refused_answer():
    question = b"\x06astral\x02sh\x00" + struct.pack("!HH", 1, 1)
    query = struct.pack("!HHHHHH", 0x1234, 0x0100, 1, 0, 0, 0) + question
    assert parse_query(query) == (0x1234, "astral.sh", question)
    answer = refused_answer(0x1234, question)
    qid, flags = struct.unpack("!HH", answer[:4])
    assert qid == 0x1234 and flags & 0x8000 and flags & 0xF == 5 and answer.endswith(question)
    assert parse_query(answer) is None and parse_query(b"\x00" * 5) is None


def test_public_network_host_option(tmp_path):
    """``--ek public_network=host``: a task whose phases are all public (Harbor's default) runs on the host's
    network (a server on the host's loopback is reachable, the host's resolver is used, nothing is recorded);
    without the option it is offline; a task that mixes public and no-network phases is refused by Harbor's
    own check, as the sandbox cannot switch its network after start."""
    import socket
    import threading

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    port = server.getsockname()[1]
    threading.Thread(target=lambda: [server.accept()[0].sendall(b"host-side\n") for _ in range(2)], daemon=True).start()
    task = make_task(tmp_path / "public", test_sh="", solve_sh="")
    probe = f"python3 -c \"import socket; print(socket.create_connection(('127.0.0.1', {port}), 2).recv(99).decode())\""

    async def body():
        on_host = LocalEnvironment.for_task(task, public_network="host")
        assert on_host.host_network and not on_host.capabilities.dynamic_network_policy
        async with on_host:
            r = await on_host.exec(probe + "; grep -c nameserver /etc/resolv.conf; getent hosts nonexistent.invalid")
            assert r.stdout.startswith("host-side\n") and r.stdout.split("\n")[2] != "0", r
            assert on_host.unreachable_lookups() == []
        offline = LocalEnvironment.for_task(task)
        assert not offline.host_network
        async with offline:
            r = await offline.exec(probe + " 2>&1; getent hosts files.example.org")
            assert "Connection refused" in r.stdout or "Network is unreachable" in r.stdout, r
            assert {h for _, h in offline.unreachable_lookups()} == {"files.example.org"}

    asyncio.run(body())
    server.close()
    mixed = make_task(tmp_path / "mixed", test_sh="echo 0 > /logs/verifier/reward.txt\n", solve_sh="")
    (mixed / "task.toml").write_text('version = "1.0"\n[agent]\nnetwork_mode = "no-network"\n')
    refused = trial(mixed, "nop", tmp_path / "trials", public_network="host")
    assert refused.reward is None and "cannot change network policy after start" in refused.error, refused


def test_phase_fault_names_hosts_once_and_only_for_public_phases(tmp_path):
    """The rule the sandbox applies after the verifier (reterm.sandbox.faults): a service look-up names its host
    (apt's ``_http._tcp.deb.debian.org``), and a look-up in a no-network phase does not count."""
    from reterm.sandbox.faults import phase_network_fault

    (tmp_path / "verifier").mkdir()
    log = [{"t": 1.0, "policy": "public", "event": "start"}, {"t": 2.0, "host": "_http._tcp.deb.debian.org"},
           {"t": 2.1, "host": "deb.debian.org"}, {"t": 5.0, "policy": "no-network", "event": "policy"},
           {"t": 6.0, "host": "pypi.org", "policy": "no-network"}]  # fmt: skip
    (tmp_path / "reterm-network.jsonl").write_text("".join(json.dumps(r) + "\n" for r in log))
    out = tmp_path / "oracle.txt"
    out.write_text("")
    phases = [("solution", (1.5, 3.0), out), ("verifier", (5.5, 7.0), tmp_path / "verifier" / "test-stdout.txt")]
    assert phase_network_fault(tmp_path, phases) == "solution could not reach: deb.debian.org"


def test_stand_in_base_fault_names_what_apt_lacks(tmp_path):
    """apt's messages in a task's own reference solution or verifier (Terminal-Bench 2.0's Ubuntu pins on the Debian
    stand-in: adaptive-rejection-sampler, build-pov-ray) name the packages; an output without them is no fault."""
    from reterm.sandbox.faults import apt_missing, phase_base_fault

    oracle = tmp_path / "oracle.txt"
    oracle.write_text("Reading package lists...\nE: Version '4.3.3-2build2' for 'r-base-core' was not found\n"
                      "Attempt 1 failed, retrying...\nE: Version '4.3.3-2build2' for 'r-base-core' was not found\n"
                      "E: Unable to locate package libfoo-ubuntu1\nE: Package 'gcc-13' has no installation candidate\n")  # fmt: skip
    clean = tmp_path / "test-stdout.txt"
    clean.write_text("1 failed\nE   assert 0 == 1\n")  # pytest's `E ` lines are not apt's
    assert apt_missing(oracle.read_text()) == ["r-base-core=4.3.3-2build2", "libfoo-ubuntu1", "gcc-13"]
    assert phase_base_fault([("solution", oracle), ("verifier", clean)]) == (
        "solution asks apt for what the stand-in base lacks: r-base-core=4.3.3-2build2, libfoo-ubuntu1, gcc-13"
    )
    assert phase_base_fault([("verifier", clean)]) is None


# A verifier that passes when the solution wrote /app/out.txt (and runs nothing that could fail on its own).
OUT_TXT_TEST = "[ -f /app/out.txt ] && echo 1 > /logs/verifier/reward.txt || echo 0 > /logs/verifier/reward.txt\n"


def assert_oracle_fault_nop_scored(task: Path, trials: Path, exception_type: str, message: str) -> None:
    """The oracle's trial ends as a sandbox fault ``exception_type`` whose message holds ``message`` in Harbor's
    result.json (no reward); the no-op agent's trial on the same task is a scored 0 with no exception."""
    out = trial(task, "oracle", trials)
    assert out.reward is None and out.outcome == "sandbox_error", out
    exc = harbor_result_of(out)["exception_info"]
    assert exc["exception_type"] == exception_type, exc
    assert message in exc["exception_message"], exc
    nop = trial(task, "nop", trials)
    assert (nop.reward, nop.outcome) == (0.0, "failure"), nop
    assert harbor_result_of(nop)["exception_info"] is None


def test_reference_solution_pinning_what_the_stand_in_lacks_is_a_sandbox_fault_in_harbors_result(tmp_path):
    """A Ubuntu task whose reference solution pins an Ubuntu package version (apt has none on the Debian stand-in):
    Harbor's result.json records StandInBaseError naming the pin and no reward; the no-op agent on the same task,
    whose verifier runs no apt, stays a scored 0 (the agent's own outcome)."""
    task = make_task(tmp_path / "ubuntu-pin", dockerfile="FROM ubuntu:24.04\nWORKDIR /app\n",
                     solve_sh="apt-get install -y --no-download wget=1.21.4-1ubuntu4.1 || exit 1\n"
                              "echo done > /app/out.txt\n",
                     test_sh=OUT_TXT_TEST)  # fmt: skip
    assert_oracle_fault_nop_scored(task, tmp_path / "job", "StandInBaseError",
                                   "solution asks apt for what the stand-in base lacks: wget=1.21.4-1ubuntu4.1")


def test_reference_solution_filling_the_writable_layer_is_a_sandbox_fault(tmp_path):
    """The writable layer lives in memory (a tmpfs of storage_mb); a reference solution that fills it (Terminal-Bench
    2.0's gcode-to-text installing opencv and matplotlib) ends as WritableLayerFullError in Harbor's result.json, not a
    scored 0; the no-op agent on the same task is scored as its verifier says."""
    task = make_task(tmp_path / "big-install", toml="[environment]\nstorage_mb = 64\n",
                     # like pip: remove what could not be finished, then print the error
                     solve_sh='err=$(dd if=/dev/zero of=/app/blob bs=1M count=200 2>&1) || { rm -f /app/blob; echo "$err"; exit 1; }\n'
                              "echo done > /app/out.txt\n",
                     test_sh=OUT_TXT_TEST)  # fmt: skip
    assert_oracle_fault_nop_scored(task, tmp_path / "job", "WritableLayerFullError",
                                   "solution ran out of the sandbox's writable layer (64 MiB")


def test_verifier_package_install_filling_the_layer_is_a_sandbox_fault_unless_the_agent_filled_it(tmp_path):
    """With the host's network the verifier's shim installs what uvx is asked for from PyPI; when that install
    runs out of the writable layer (Terminal-Bench 2.0's torch tasks: torch 2.7.0 with its CUDA wheels in a 3 GiB
    layer) and the agent had left the layer at most half full, Harbor's result.json records WritableLayerFullError
    naming the package. A reference solution that left the layer more than half full makes the same install fail
    as its own doing: a scored 0 with no exception, and not a network fault either."""
    test_sh = ('uvx -w scipy==1.14.1 python3 -c "import scipy" && echo 1 > /logs/verifier/reward.txt '
               "|| echo 0 > /logs/verifier/reward.txt\n")  # fmt: skip
    toml = "[environment]\nstorage_mb = 48\n"
    small = make_task(tmp_path / "small", toml=toml, test_sh=test_sh, solve_sh="echo done > /app/out.txt\n")
    out = trial(small, "oracle", tmp_path / "job", public_network="host")
    assert out.reward is None and out.outcome == "sandbox_error", out
    exc = harbor_result_of(out)["exception_info"]
    assert exc["exception_type"] == "WritableLayerFullError", exc
    assert "verifier's package install ran out of the sandbox's writable layer (48 MiB" in exc["exception_message"]
    assert exc["exception_message"].endswith("python:scipy (give the trial more with --ek storage_mb=... memory_mb=...)")
    assert "; " not in exc["exception_message"]  # one reason: the tables split a trial's reasons at "; "
    filler = make_task(tmp_path / "filler", toml=toml, test_sh=test_sh,
                       solve_sh="dd if=/dev/zero of=/app/blob bs=1M count=30 2>/dev/null; echo done > /app/out.txt\n")
    out = trial(filler, "oracle", tmp_path / "job", public_network="host")
    assert (out.reward, out.outcome) == (0.0, "failure"), out
    assert harbor_result_of(out)["exception_info"] is None
