"""The 9B recipe's GPU set: pip resolves it against the package index (dry run, nothing installed), an unsatisfiable
pin makes the resolution fail, and every ``vllm serve`` line (model card, REPRODUCING, run_all, the configs) carries
the tool-call flags a request with ``tools`` needs.

The resolution tests need the package index (CI has it): a slow or unreachable index fails them (no skip).
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

import jinja2
import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))
import resolve_gpu_set  # noqa: E402

TOOL_FLAGS = ["--enable-auto-tool-choice", "--tool-call-parser", "qwen3_coder"]


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_gpu_set_resolves_with_pip():
    got = resolve_gpu_set.resolve(timeout_s=600)
    pins = {}
    for f in (resolve_gpu_set.WHEELS, resolve_gpu_set.SDISTS):
        pins.update(dict(x.split("==") for x in resolve_gpu_set.requirement_lines(f)))
    # pip would install exactly the pinned versions, and vLLM's own requirements came along (flashinfer, xgrammar)
    assert {k.lower(): got.get(k.lower()) for k in pins} == {k.lower(): v for k, v in pins.items()}
    assert got["vllm"] == "0.33.0" and got["torch"] == "2.14.0" and "flashinfer-python" in got
    assert got["fastapi"].startswith("0.136.")  # vLLM's cap; harbor (installed --no-deps) is not in the resolution


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_an_unsatisfiable_pin_fails_the_resolution(tmp_path):
    # vllm 0.34.0 requires flashinfer-python==0.7.3, which the index does not have (0.7.2.post1, then 0.7.4): pinning
    # that version beside the set must make pip's resolution fail, naming it
    wheels = tmp_path / "requirements-gpu.txt"
    text = resolve_gpu_set.WHEELS.read_text()
    assert "vllm==0.33.0" in text
    wheels.write_text(text.replace("vllm==0.33.0", "vllm==0.33.0\nflashinfer-python==0.7.3"))
    t0 = time.monotonic()
    with pytest.raises(resolve_gpu_set.ResolutionError, match=r"flashinfer-python==0\.7\.3"):
        resolve_gpu_set.resolve(wheels, resolve_gpu_set.SDISTS, resolve_gpu_set.NODEPS, timeout_s=600)
    print(f"the unsatisfiable set failed after {time.monotonic() - t0:.0f} s")


def test_a_missing_sdist_pin_fails_before_pip_runs(tmp_path):
    sdists = tmp_path / "build.txt"
    sdists.write_text("causal-conv1d==1.7.0.99  # no such release\n")
    with pytest.raises(resolve_gpu_set.ResolutionError, match=r"causal-conv1d==1.7.0.99: the index has no"):
        resolve_gpu_set.sdist_requirements(resolve_gpu_set.requirement_lines(sdists), tmp_path / "d")
    sdists.write_text("causal-conv1d>=1.7\n")
    with pytest.raises(resolve_gpu_set.ResolutionError, match="not an exact pin"):
        resolve_gpu_set.sdist_requirements(resolve_gpu_set.requirement_lines(sdists), tmp_path / "d")


def test_the_sdists_requirements_come_from_their_pkg_info(tmp_path):
    reqs = resolve_gpu_set.sdist_requirements(["causal-conv1d==1.7.0", "deepspeed==0.19.8"], tmp_path)
    names = {re.split(r"[<>=!~; ]", r, maxsplit=1)[0].lower() for r in reqs}
    assert {"torch", "ninja", "hjson", "pydantic"} <= names and not any("extra ==" in r for r in reqs)


# ------------------------------------------------------------------------------------------ vllm serve lines
def _tool_flags(argv: list[str]) -> list[str]:
    i = argv.index("--tool-call-parser")
    return ["--enable-auto-tool-choice" if "--enable-auto-tool-choice" in argv else "(missing)", *argv[i : i + 2]]


def _serve_commands(text: str) -> list[list[str]]:
    """Every ``vllm serve ...`` command of a text (lines joined at a trailing backslash, comment marks dropped)."""
    text = re.sub(r"\\\n\s*#?\s*", " ", text)
    out = []
    for line in text.splitlines():
        m = re.search(r"vllm serve [^`'\n]*", line)
        if m and "..." not in m.group(0) and len(m.group(0).split()) > 3:
            out.append(shlex.split(m.group(0).split("  #")[0]))
    return out


def test_every_vllm_serve_line_carries_the_qwen35_tool_call_flags():
    # run_all: the flags every server it starts gets (train/stages.py with-vllm --vllm-arg ...)
    run_all = (REPO / "train/run_all.sh").read_text()
    m = re.search(r"VLLM_ARGS=\(\$\{RETERM_VLLM_ARGS:-([^}]*)\}\)", run_all)
    assert m, "run_all.sh: the default VLLM_ARGS line moved"
    assert _tool_flags(m.group(1).split()) == TOOL_FLAGS
    # the model card of a Qwen3.5 checkpoint, both branches (full model, LoRA adapter); a ChatML (SmolLM2) one: hermes
    template = (REPO / "reterm/cards/templates/model.md").read_text()
    block = template[template.index("### Serve with vLLM") : template.index("### Evaluate in Harbor")]
    for kind in ("full", "adapter"):
        card = jinja2.Template(block).render(kind=kind, base="Qwen/Qwen3.5-9B", served="reterm-9b", repo_id="o/ReTerm-9B")
        (cmd,) = _serve_commands(card)
        assert _tool_flags(cmd) == TOOL_FLAGS, card
    small = jinja2.Template(block).render(kind="full", base="HuggingFaceTB/SmolLM2-135M-Instruct", served="s", repo_id="o/s")
    assert _tool_flags(_serve_commands(small)[0])[2] == "hermes"  # the kit's ChatML template: Hermes JSON tool calls
    # REPRODUCING and the configs: every full `vllm serve MODEL ...` line of Qwen3.5
    docs = {p: _serve_commands(p.read_text()) for p in [REPO / "docs/REPRODUCING.md", REPO / "pipeline/configs/reterm-10k.yaml",
                                                         *sorted((REPO / "eval/configs").glob("*.yaml"))]}  # fmt: skip
    assert docs[REPO / "docs/REPRODUCING.md"], "REPRODUCING.md shows no vllm serve command"
    for path, cmds in docs.items():
        for cmd in cmds:
            if "Qwen3.5" in cmd[2] or "/sft" in cmd[2] or "RUN/" in cmd[2]:
                assert _tool_flags(cmd) == TOOL_FLAGS, f"{path.relative_to(REPO)}: {' '.join(cmd)}"


def test_setup_gpu_refuses_a_venv_with_the_cpu_set(tmp_path):
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin/python").symlink_to(sys.executable)
    proc = subprocess.run(["bash", "scripts/setup_gpu.sh"], cwd=REPO, capture_output=True, text=True,
                          env={"PATH": "/usr/bin:/bin", "RETERM_VENV": str(venv)}, timeout=60)  # fmt: skip
    assert proc.returncode == 1 and "exists with another package set" in proc.stderr
