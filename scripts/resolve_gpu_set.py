"""Resolve the 9B recipe's GPU environment against the package index with pip's own resolver, installing nothing.

``python scripts/resolve_gpu_set.py [--report FILE]`` exits 0 when pip can install the GPU set together, 1 when it
cannot (pip's error is printed: which pin conflicts or does not exist), 2 on bad input. The set is the three files
``scripts/setup_gpu.sh`` installs, in its order:

- ``requirements-gpu.txt`` (wheels): resolved by ``pip install --dry-run --ignore-installed --only-binary=:all:
  --report``, so no source distribution is built and nothing is installed; pip reads each candidate's metadata
  (from the index's PEP 658 ``.metadata`` file where it serves one, else from the wheel it downloads into its
  cache; measured on a machine whose index serves none: 2.5-3 min, mostly the CUDA wheels' downloads).
- ``requirements-gpu-build.txt`` (source distributions built with ``--no-build-isolation`` against the installed
  torch): building their metadata would install torch into a build environment, so instead each pinned sdist is
  downloaded (30 kB and 2 MB) and the ``Requires-Dist`` lines of its ``PKG-INFO`` (what its ``setup.py`` declared
  when the sdist was made) join the resolution above.
- ``requirements-gpu-nodeps.txt`` (installed ``--no-deps``, e.g. harbor): each pin must exist on the index
  (``pip download --no-deps``); their dependencies are pinned in ``requirements-gpu.txt`` on purpose.

Network policy: the index is required. A slow or unreachable index is a failure (exit 1), not a skip: CI has
the index, and a check that passes without resolving proves nothing.
"""

from __future__ import annotations

import argparse
import email.parser
import hashlib
import json
import re
import subprocess
import sys
import tarfile
import tempfile
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
WHEELS = REPO / "requirements-gpu.txt"
SDISTS = REPO / "requirements-gpu-build.txt"
NODEPS = REPO / "requirements-gpu-nodeps.txt"
#: the simple API the source distributions are read from (PEP 691 JSON); pip uses its own configured index
INDEX = "https://pypi.org/simple"


class ResolutionError(RuntimeError):
    """pip could not resolve the set (its message: the conflicting or missing pin)."""


def requirement_lines(path: Path) -> list[str]:
    """The requirement lines of a requirements file, comments and blank lines dropped.

    Raises:
        FileNotFoundError: no such file.
    """
    out = []
    for line in Path(path).read_text().splitlines():
        text = line.split("#", 1)[0].strip()
        if text:
            out.append(text)
    return out


def _pip(args: list[str], timeout_s: float) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "pip", *args]
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired as e:
        raise ResolutionError(f"{' '.join(cmd[:6])} ...: no answer within {timeout_s:.0f} s (index too slow?)") from e


def _pip_error(proc: subprocess.CompletedProcess) -> str:
    """pip's own error (its stderr from the first ``ERROR:`` line; else the output's last lines)."""
    err = [x for x in proc.stderr.splitlines() if x.strip() and "Location 'file:" not in x]
    first = next((i for i, x in enumerate(err) if x.startswith("ERROR:")), None)
    if first is not None:
        return "\n".join(err[first:][:40])
    return "\n".join((err or proc.stdout.splitlines())[-25:])


def sdist_requirements(pins: list[str], workdir: Path, index: str = INDEX, timeout_s: float = 120) -> list[str]:
    """The unconditional ``Requires-Dist`` of pinned source distributions, read from their ``PKG-INFO``.

    The archive is fetched by its file entry in the index's JSON simple API (PEP 691) and checked against the
    index's sha256; ``pip download`` cannot be used, since it prepares the metadata by running the package's
    ``setup.py``, which for these packages imports torch.

    Args:
        pins: ``name==version`` lines (``requirements-gpu-build.txt``).
        workdir: where the sdists are downloaded.
        index: the simple API's root URL (default PyPI's).

    Raises:
        ResolutionError: a pin is not ``name==version``, has no source distribution on the index, the download
            does not match the index's hash, or its ``PKG-INFO`` cannot be read.
    """
    out: list[str] = []
    workdir.mkdir(parents=True, exist_ok=True)
    for pin in pins:
        if "==" not in pin:
            raise ResolutionError(f"{SDISTS.name}: {pin!r} is not an exact pin (name==version)")
        name, version = (x.strip() for x in pin.split("==", 1))
        norm = re.sub(r"[-_.]+", "-", name).lower()
        want = f"{norm.replace('-', '_')}-{version}.tar.gz"
        try:
            req = urllib.request.Request(f"{index.rstrip('/')}/{norm}/",
                                         headers={"Accept": "application/vnd.pypi.simple.v1+json"})  # fmt: skip
            with urllib.request.urlopen(req, timeout=timeout_s) as r:
                files = json.load(r)["files"]
            entry = next((f for f in files if f["filename"].lower().replace("-", "_") == want.replace("-", "_")), None)
            if entry is None:
                raise ResolutionError(f"{SDISTS.name}: {pin}: the index has no {want}")
            with urllib.request.urlopen(entry["url"], timeout=timeout_s) as r:
                data = r.read()
        except (OSError, ValueError, KeyError) as e:
            raise ResolutionError(f"{SDISTS.name}: {pin}: {index} did not answer: {e}") from e
        sha = entry.get("hashes", {}).get("sha256")
        if sha and hashlib.sha256(data).hexdigest() != sha:
            raise ResolutionError(f"{SDISTS.name}: {pin}: {entry['filename']} does not match the index's sha256")
        archive = workdir / entry["filename"]
        archive.write_bytes(data)
        with tarfile.open(archive) as tar:
            member = next((m for m in tar.getmembers() if m.name.count("/") == 1 and m.name.endswith("/PKG-INFO")), None)
            if member is None:
                raise ResolutionError(f"{archive.name}: no PKG-INFO")
            meta = email.parser.Parser().parsestr(tar.extractfile(member).read().decode())
        out += [r for r in meta.get_all("Requires-Dist") or [] if "extra ==" not in r]
    return out


def resolve(wheels: Path = WHEELS, sdists: Path = SDISTS, nodeps: Path = NODEPS,
            timeout_s: float = 600) -> dict[str, str]:  # fmt: skip
    """Resolve the GPU set with pip (dry run) and return ``{name: version}`` of everything pip would install.

    Raises:
        ResolutionError: pip finds no set of versions that meets every pin (its message names the conflict), a
            pinned sdist or ``--no-deps`` package does not exist on the index, or the index does not answer in
            ``timeout_s`` seconds.
        FileNotFoundError: a requirements file is missing.
    """
    with tempfile.TemporaryDirectory(prefix="resolve-gpu-set-") as tmp:
        tmp_dir = Path(tmp)
        for pin in requirement_lines(nodeps):
            proc = _pip(["download", "--no-deps", "--only-binary=:all:", "--dest", str(tmp_dir / "nodeps"),
                         "--progress-bar", "off", pin], timeout_s)  # fmt: skip
            if proc.returncode != 0:
                raise ResolutionError(f"{nodeps.name}: {pin}: not installable\n{_pip_error(proc)}")
        build = requirement_lines(sdists)
        reqs = requirement_lines(wheels) + sdist_requirements(build, tmp_dir / "sdists")
        combined = tmp_dir / "combined.txt"
        combined.write_text("\n".join(reqs) + "\n")
        report = tmp_dir / "report.json"
        proc = _pip(["install", "--dry-run", "--ignore-installed", "--only-binary=:all:", "--progress-bar", "off",
                     "--report", str(report), "-r", str(combined)], timeout_s)  # fmt: skip
        if proc.returncode != 0:
            raise ResolutionError(f"{wheels.name} + {sdists.name}'s requirements do not resolve:\n{_pip_error(proc)}")
        got = {i["metadata"]["name"].lower(): i["metadata"]["version"] for i in json.loads(report.read_text())["install"]}
        for pin in build:  # the sdists themselves are installed after this resolution: their pins must exist
            got[pin.split("==")[0].lower()] = pin.split("==")[1]
        return got


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--wheels", type=Path, default=WHEELS, help="default requirements-gpu.txt")
    p.add_argument("--sdists", type=Path, default=SDISTS, help="default requirements-gpu-build.txt")
    p.add_argument("--nodeps", type=Path, default=NODEPS, help="default requirements-gpu-nodeps.txt")
    p.add_argument("--timeout", type=float, default=600, help="seconds for each pip call (default 600)")
    p.add_argument("--report", type=Path, help="write the resolved {name: version} here (JSON)")
    a = p.parse_args(argv)
    for f in (a.wheels, a.sdists, a.nodeps):
        if not f.is_file():
            print(f"resolve_gpu_set: {f}: no such file", file=sys.stderr)
            return 2
    try:
        got = resolve(a.wheels, a.sdists, a.nodeps, a.timeout)
    except ResolutionError as e:
        print(f"resolve_gpu_set: FAILED: {e}", file=sys.stderr)
        return 1
    if a.report:
        a.report.write_text(json.dumps(got, indent=1, sort_keys=True) + "\n")
    key = ("torch", "transformers", "vllm", "trl", "flash-linear-attention", "causal-conv1d", "deepspeed", "fastapi")
    print(f"resolve_gpu_set: OK: {len(got)} packages; " + ", ".join(f"{k} {got.get(k, '?')}" for k in key))
    return 0


if __name__ == "__main__":
    sys.exit(main())
