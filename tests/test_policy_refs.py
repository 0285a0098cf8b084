"""``hf:REF`` without guessing: a path is a path (it starts with ``/``, ``.`` or ``~``), anything else a Hub
id, fetched from the Hub (here the kit's local Hub-compatible server), never a same-named folder of the
working directory; the errors say what REF was read as and what was tried."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from reterm.policies import check_policy_spec, is_local_path, load_policy, resolve_hf_model
from reterm.tiny_qwen import build_tiny_qwen3_5

from hub_server import HubServer

TOKEN = "hf_" + "PolicyRefsTokenAbcdefghijklmnopq12"
REPO = str(Path(__file__).resolve().parents[1])


def test_how_a_reference_is_read(tmp_path, monkeypatch):
    assert [is_local_path(r) for r in ("/m", "./m", "../m", "~/m", ".m", "m", "org/m")] == [True] * 5 + [False] * 2
    assert resolve_hf_model("smollm2") == "smollm2" and resolve_hf_model("tiny-qwen3.5") == "tiny-qwen3.5"
    (tmp_path / "ckpt").mkdir()
    monkeypatch.chdir(tmp_path)
    assert resolve_hf_model("./ckpt") == str(tmp_path / "ckpt")
    with pytest.raises(ValueError, match=r"hf:\./gone: read as a local path .*no such model folder .*gone \(nothing there\)"):
        resolve_hf_model("./gone")
    (tmp_path / "file").write_text("x")
    with pytest.raises(ValueError, match=r"a file, not a folder"):
        resolve_hf_model(str(tmp_path / "file"))
    # a relative path without ./ is a Hub id; this one is not a valid one, and the message says how to write the path
    with pytest.raises(ValueError, match=r"(?s)read as a Hub id .*not a valid one.*hf:\./runs/x/merged"):
        resolve_hf_model("runs/x/merged")
    with pytest.raises(ValueError, match="hf:<local-path-or-hub-id>"):
        load_policy("hf:")


def test_plain_paths_are_policy_specs(tmp_path):
    assert check_policy_spec("./ckpt") == "./ckpt" and check_policy_spec("/abs/ckpt") == "/abs/ckpt"
    with pytest.raises(ValueError, match=r"no such model folder .*nope"):
        load_policy(str(tmp_path / "nope"))  # read as hf:<path>
    with pytest.raises(ValueError, match="unknown policy spec 'ckpt'"):
        check_policy_spec("ckpt")


def _run(env, cwd, script):
    return subprocess.run([sys.executable, "-c", script], env=env, cwd=cwd, capture_output=True, text=True,
                          timeout=300)  # fmt: skip


def test_a_hub_id_comes_from_the_hub_never_from_a_same_named_folder(tmp_path):
    tiny = build_tiny_qwen3_5()
    work = tmp_path / "work"
    (work / "team" / "tiny").mkdir(parents=True)  # a decoy folder with the Hub id's name, not a model
    (work / "team" / "tiny" / "config.json").write_text("{not json")
    with HubServer(tmp_path / "hub", tokens={TOKEN: "alice"}, orgs={"alice": ["team"]}) as hub:
        env = hub.client_env(token=TOKEN)
        env.update(HF_HOME=str(tmp_path / "home"), PYTHONPATH=REPO, OMP_WAIT_POLICY="PASSIVE")
        script = f"""
import json
from huggingface_hub import HfApi
HfApi().create_repo("team/tiny")
HfApi().upload_folder(repo_id="team/tiny", folder_path={str(tiny)!r})
from reterm.policies import load_policy
p = load_policy("hf:team/tiny", temperature=0, max_new_tokens=2)
print(json.dumps({{"name": p.name, "path": p.model_path}}))
"""
        r = _run(env, work, script)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["name"] == "hf:team/tiny" and out["path"].startswith(str(tmp_path / "home"))


def test_an_unreachable_hub_fails_fast_naming_what_was_tried(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens here once the socket is closed
    (tmp_path / "ReTerm-9B").mkdir()
    env = {**os.environ, "HF_ENDPOINT": f"http://127.0.0.1:{port}", "HF_HOME": str(tmp_path / "home"),
           "PYTHONPATH": REPO}  # fmt: skip
    script = """
import time
from reterm.policies import load_policy
t = time.monotonic()
try:
    load_policy("hf:ReTerm-9B")
except ValueError as exc:
    print(f"{time.monotonic() - t:.2f}"); print(exc)
"""
    start = time.monotonic()
    r = _run(env, tmp_path, script)
    assert r.returncode == 0, r.stderr[-3000:]
    seconds, message = r.stdout.split("\n", 1)
    assert float(seconds) < 5 and time.monotonic() - start < 60
    assert "hf:ReTerm-9B: read as a Hub id" in message and f"127.0.0.1:{port}" in message
    assert "hf:./ReTerm-9B (./ReTerm-9B exists here)" in message
