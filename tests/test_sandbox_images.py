"""Builds of Terminal-Bench 2.0 style Dockerfiles on the local sandbox (issue 33): ``FROM python:X`` provides
python, python3, pip and pip3 in default and strict mode; a failed RUN that could not reach a host says so
(not the note about Debian package names); multi-stage builds are refused with what to do instead."""

from __future__ import annotations

import asyncio
import textwrap
import uuid
from pathlib import Path

import pytest
from harbor.environments.base import SandboxBuildFailedError

from reterm.sandbox.base_image import ensure_base
from reterm.sandbox.build import cached_failure, ensure_layer, layer_key, upload_date
from reterm.sandbox.dockerfile import DockerfileError
from reterm.sandbox.local import LocalEnvironment

PYTHON_CHECK = "python --version && python3 --version && pip --version && pip3 --version && pip install --help >/dev/null"


def make_task(root: Path, dockerfile: str) -> Path:
    (root / "environment").mkdir(parents=True)
    (root / "tests").mkdir()
    (root / "task.toml").write_text('version = "1.0"\n[environment]\nnetwork_mode = "no-network"\n')
    (root / "instruction.md").write_text("do it\n")
    (root / "tests" / "test.sh").write_text("echo 1 > /logs/verifier/reward.txt\n")
    (root / "environment" / "Dockerfile").write_text(textwrap.dedent(dockerfile))
    return root


async def _run(task: Path, command: str):
    env = LocalEnvironment.for_task(task)
    async with env:
        return await env.exec(command)


@pytest.mark.parametrize("strict", [False, pytest.param(True, marks=pytest.mark.slow)], ids=["default", "strict"])
def test_python_image_provides_python_and_pip(tmp_path, monkeypatch, strict):
    """Strict mode builds the bare base first (debootstrap, about a minute, once) and installs Debian's Python."""
    if strict:
        monkeypatch.setenv("RETERM_SANDBOX_STRICT", "1")
    task = make_task(tmp_path / "py", "FROM python:3.13-slim-bookworm\nWORKDIR /app\nRUN pip install --help >/dev/null\n")
    r = asyncio.run(_run(task, PYTHON_CHECK))
    assert r.return_code == 0, r
    assert r.stdout.startswith("Python 3.11.") and "pip " in r.stdout, r.stdout  # Debian 12's, whatever X says
    # as in the python images, the interpreter's C headers are there: a C extension builds (Terminal-Bench 2.0's
    # feal-differential-cryptanalysis and portfolio-optimization build theirs with setup.py)
    r = asyncio.run(_run(task, 'python3 -c "import sysconfig, os; print(os.path.isfile(os.path.join('
                               "sysconfig.get_paths()['include'], 'Python.h')))\""))
    assert r.return_code == 0 and r.stdout.strip() == "True", r


def test_failed_run_that_could_not_reach_a_host_says_so(tmp_path):
    task = make_task(tmp_path / "net", "FROM ubuntu:24.04\nRUN curl -fsSL -o /tmp/x.sh https://tools.unreachable-host.example/x.sh && sh /tmp/x.sh\n")
    with pytest.raises(SandboxBuildFailedError) as err:
        asyncio.run(_run(task, "true"))
    text = str(err.value)
    assert "Dockerfile:2" in text and "could not reach tools.unreachable-host.example" in text, text
    assert "package names or versions" not in text  # not the Debian note: the cause is the network


def test_failed_apt_install_of_an_ubuntu_package_keeps_the_debian_note(tmp_path):
    task = make_task(tmp_path / "pkg", "FROM ubuntu:24.04\nRUN apt-get install -y no-such-package-reterm\n")
    with pytest.raises(SandboxBuildFailedError, match="package names or versions of another distribution"):
        asyncio.run(_run(task, "true"))


@pytest.mark.parametrize(
    "dockerfile,line,text",
    [
        ("FROM python:3.13 AS build\nRUN true\nFROM python:3.13-slim\nCOPY --from=build /x /y\n", 3,
         "a second FROM (a multi-stage build; the first stage starts at line 1)"),
        ("FROM python:3.13-slim\nCOPY --from=ghcr.io/astral-sh/uv:0.9 /uv /bin/uv\n", 2,
         "COPY --from copies out of another image or build stage"),
    ],
)
def test_multi_stage_is_refused_with_what_to_do(tmp_path, dockerfile, line, text):
    task = make_task(tmp_path / "ms", dockerfile)
    with pytest.raises(DockerfileError) as err:
        asyncio.run(_run(task, "true"))
    assert f"Dockerfile:{line}: {text}" in str(err.value) and "harbor run -e docker" in str(err.value)


def test_failed_build_is_cached_as_failed_with_its_reason(tmp_path):
    """A build step that fails is not redone by the next trial of the task: it fails at once with the recorded
    reason; force_build builds again."""
    dockerfile = f"FROM debian:bookworm-slim\nRUN echo {uuid.uuid4().hex} && exit 7\n"  # a fresh cache key
    task = make_task(tmp_path / "fails", dockerfile)
    base = ensure_base()
    key = layer_key(dockerfile, task / "environment", base)
    assert cached_failure(key) is None
    with pytest.raises(SandboxBuildFailedError, match="exit code 7") as first:
        asyncio.run(_run(task, "true"))
    rec = cached_failure(key)
    assert rec is not None and rec["reason"] == str(first.value)
    with pytest.raises(SandboxBuildFailedError) as again:  # the next trial: the same reason, nothing rebuilt
        asyncio.run(_run(task, "true"))
    assert str(first.value) in str(again.value) and "force_build" in str(again.value)
    assert cached_failure(key)["failed_at"] == rec["failed_at"]
    with pytest.raises(SandboxBuildFailedError, match="exit code 7") as forced:
        asyncio.run(ensure_layer(task / "environment", base, force=True))
    assert "force_build" not in str(forced.value) and cached_failure(key)["failed_at"] > rec["failed_at"]


@pytest.mark.parametrize(
    "image,suite",
    [("debian:13", "trixie"), ("debian:13-slim", "trixie"), ("docker.io/library/debian:trixie-slim", "trixie"),
     ("debian:bookworm-slim", "bookworm"), ("debian:12", "bookworm"), ("ubuntu:24.04", "bookworm"),
     ("python:3.13-slim-trixie", "bookworm"), ("debian:130", "bookworm")],
)  # fmt: skip
def test_debian_13_images_get_a_trixie_base(image, suite):
    from reterm.sandbox.dockerfile import debian_suite

    assert debian_suite(image) == suite


@pytest.mark.slow  # builds the Debian 13 base once (debootstrap trixie from the Debian mirror, about 2 minutes)
def test_from_debian_13_runs_on_a_real_debian_13_base(tmp_path):
    """`FROM debian:13` gets a real trixie root (its os-release, its Python 3.13), not the bookworm stand-in."""
    task = make_task(tmp_path / "d13", "FROM debian:13\nWORKDIR /app\nRUN test -f /etc/debian_version\n")
    r = asyncio.run(_run(task, ". /etc/os-release && echo $VERSION_ID $VERSION_CODENAME && python3 -c "
                               "'import sys; print(sys.version_info[:2])' && tmux -V"))
    assert r.return_code == 0, r
    lines = r.stdout.splitlines()
    assert lines[0] == "13 trixie" and lines[1] == "(3, 13)", r.stdout


@pytest.mark.parametrize("image,date", [("alexgshaw/mteb-retrieve:20251031", "2025-10-31T00:00:00Z"),
                                        ("python:3.13-slim", None), ("x/y:20251331", None), (None, None)])
def test_an_image_tag_that_is_a_date_gives_the_index_date(image, date):
    assert upload_date(image) == date


def test_a_dated_image_resolves_python_packages_as_of_its_date(tmp_path):
    """A task.toml image tagged with its build date (Terminal-Bench 2.0's ``NAME:20251031``): the Dockerfile's
    unpinned ``pip install`` takes what the index had then (pyfiglet 0.8.post1 of 2019, not 1.x), through pip 26
    on the build steps' path only: the image keeps Debian's pip and no trace of the build's. A Dockerfile that
    installs no Python package is not touched (its layer key has no date)."""
    dockerfile = "FROM python:3.11-slim\nRUN pip install --quiet --no-cache-dir pyfiglet\n"
    task = make_task(tmp_path / "dated", dockerfile)
    (task / "task.toml").write_text('version = "1.0"\n[environment]\nnetwork_mode = "no-network"\n'
                                    'docker_image = "example/dated:20200101"\n')  # fmt: skip
    r = asyncio.run(_run(task, "python3 -c 'import importlib.metadata as m; print(m.version(\"pyfiglet\"))'; "
                               "pip --version; ls /opt/reterm-build-pip 2>&1 | head -1"))  # fmt: skip
    assert r.return_code == 0, r
    version, pip, leftover = r.stdout.splitlines()[:3]
    assert version == "0.8.post1", r.stdout
    assert pip.startswith("pip 23."), pip  # Debian 12's pip, as before
    assert "No such file" in leftover
    base = ensure_base()
    assert layer_key(dockerfile, task / "environment", base, "2020-01-01T00:00:00Z") != \
        layer_key(dockerfile, task / "environment", base)
    plain = "FROM python:3.11-slim\nRUN echo no packages\n"
    assert layer_key(plain, None, base, "2020-01-01T00:00:00Z") == layer_key(plain, None, base)


def test_a_build_that_filled_the_disk_is_not_remembered_as_failed(tmp_path):
    """The layer is built in a folder on this machine's disk: a step that ends with ENOSPC failed for want of
    the machine's room, not for the task, so the next start builds again instead of repeating a cached reason."""
    dockerfile = f"FROM debian:bookworm-slim\nRUN echo {uuid.uuid4().hex}; echo 'OSError: [Errno 28] No space left on device' >&2; exit 1\n"
    task = make_task(tmp_path / "full", dockerfile)
    key = layer_key(dockerfile, task / "environment", ensure_base())
    with pytest.raises(SandboxBuildFailedError, match="disk filled up during the build"):
        asyncio.run(_run(task, "true"))
    assert cached_failure(key) is None
