"""The 9B recipe's GPU kernels: requirements-gpu.txt pins them, `--check` lists them and reports a missing or
mismatched one (a failure on a GPU machine, a warning on a CPU), and the Qwen3.5 functions transformers really
dispatches to are read from the module (reterm/training/kernels.py, train/check_recipe.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "train"))

import check_recipe  # noqa: E402  (train/check_recipe.py)

from reterm.training.kernels import (  # noqa: E402
    check_gpu_packages,
    kernels_in_use,
    read_pins,
    vllm_requirement_problems,
)

GPU_H200 = (True, True, "1 x NVIDIA H200 (sm_90)")
CPU = (False, False, "no CUDA device (CPU)")
PINNED = {"flash-linear-attention": "0.6.0", "fla-core": "0.6.0", "causal-conv1d": "1.7.0", "deepspeed": "0.19.8",
          "triton": "3.8.0", "torch": "2.14.1", "transformers": "5.24.0", "vllm": "0.34.0"}  # fmt: skip


def _status(lines):
    return {item: (status, detail) for item, status, detail in lines}


def test_requirements_gpu_pins_the_kernels_the_recipe_needs():
    pins = check_recipe.gpu_pins()  # the three files of the GPU set
    assert pins["flash-linear-attention"] == pins["fla-core"] == "0.6.0"
    assert {"causal-conv1d", "deepspeed", "vllm", "torch", "transformers", "trl", "harbor"} <= set(pins)
    # the sdists are built against the set's torch (--no-build-isolation), so they sit in their own file
    assert set(read_pins(REPO / "requirements-gpu-build.txt")) == {"causal-conv1d", "deepspeed"}
    assert set(read_pins(REPO / "requirements-gpu.txt")).isdisjoint(read_pins(REPO / "requirements-gpu-build.txt"))


def test_a_missing_kernel_fails_on_a_gpu_machine_and_warns_on_a_cpu():
    env = dict(PINNED)
    del env["causal-conv1d"]
    ok = lambda: []  # noqa: E731  (vLLM's own requirements met)
    gpu = _status(check_recipe.gpu_package_checks(machine=GPU_H200, version_of=env.get, vllm_problems=ok))
    assert gpu["causal-conv1d==1.7.0"][0] == "FAIL" and "not installed" in gpu["causal-conv1d==1.7.0"][1]
    assert gpu["flash-linear-attention==0.6.0"] == ("OK", "0.6.0") and gpu["deepspeed==0.19.8"][0] == "OK"
    assert gpu["triton"][0] == "OK" and gpu["vllm"] == ("OK", "0.34.0")
    cpu = _status(check_recipe.gpu_package_checks(machine=CPU, version_of=env.get, vllm_problems=ok))
    assert cpu["causal-conv1d==1.7.0"][0] == "WARN"
    assert cpu["CUDA (torch)"][0] == "WARN" and "failures on a GPU machine" in cpu["CUDA (torch)"][1]


def test_mismatched_versions_are_failures_on_a_gpu_machine():
    env = {**PINNED, "flash-linear-attention": "0.5.2", "triton": "3.7.0"}
    unmet = lambda: ["torch==2.14.0 (installed 2.14.1)"]  # noqa: E731
    lines = _status(check_recipe.gpu_package_checks(machine=GPU_H200, version_of=env.get, vllm_problems=unmet))
    assert lines["flash-linear-attention==0.6.0"] == ("FAIL", "0.5.2 installed, the GPU set pins 0.6.0")
    assert lines["triton"][0] == "FAIL" and "fla issue #640" in lines["triton"][1]  # Hopper + Triton < 3.7.1
    assert lines["vllm"][0] == "FAIL" and "requires torch==2.14.0" in lines["vllm"][1]
    # Triton 3.7.0 is only a problem for fla's backward on Hopper
    ampere = _status(check_recipe.gpu_package_checks(machine=(True, False, "A100"), version_of=env.get,
                                                     vllm_problems=unmet))  # fmt: skip
    assert ampere["triton"][0] == "OK"


def test_vllm_requirements_are_read_from_its_metadata():
    reqs = ["torch==2.14.0", "transformers<5.23.0,>=5.16.1", "numpy", 'pytest; extra == "test"']
    problems = vllm_requirement_problems(version_of=PINNED.get, requires=lambda name: reqs)
    assert problems == ["torch==2.14.0 (installed 2.14.1)", "transformers<5.23.0,>=5.16.1 (installed 5.24.0)"]
    assert vllm_requirement_problems(version_of={**PINNED, "vllm": None}.get, requires=lambda n: reqs) == []
    assert check_gpu_packages({}, version_of={**PINNED, "vllm": None}.get)[-1].problem == "missing"


def test_read_pins_refuses_a_line_it_cannot_check(tmp_path):
    f = tmp_path / "req.txt"
    f.write_text("# comment\nfla-core==0.6.0  # why\n\ncausal-conv1d>=1.7\n")
    with pytest.raises(ValueError, match=r"req.txt:4: 'causal-conv1d>=1.7' is not an exact pin"):
        read_pins(f)


def test_this_cpu_machine_reports_the_torch_fallback_as_warnings():
    # the real environment: no fla or causal-conv1d here, so transformers dispatches to its PyTorch code
    used = kernels_in_use()
    assert set(used) == {"torch_chunk_gated_delta_rule", "torch_recurrent_gated_delta_rule", "causal_conv1d_fn",
                         "causal_conv1d_update"}  # fmt: skip
    assert used["torch_chunk_gated_delta_rule"] == "torch fallback (flash-linear-attention not installed)"
    lines = _status(check_recipe.gpu_package_checks(machine=CPU))
    assert lines["Qwen3.5 kernels in use"][0] == "WARN" and "causal_conv1d_fn -> torch fallback" in (
        lines["Qwen3.5 kernels in use"][1])
    assert not [item for item, (status, _) in lines.items() if status == "FAIL"]
    assert lines["triton"] == ("OK", "3.8.0 (torch 2.14.1's)")
