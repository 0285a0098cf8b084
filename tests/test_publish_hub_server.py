"""The local Hub-compatible test server against the real clients: huggingface_hub, datasets, the hf CLI."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from hub_server import HubServer, patched_hub_endpoint

TOKEN = "hf_" + "ServerTestTokenAbcdefghijklmnopqr12"
BIN = Path(sys.executable).parent


@pytest.fixture
def hub(tmp_path):
    with HubServer(tmp_path / "hub", tokens={TOKEN: "alice"}, orgs={"alice": ["team"]}, lfs_threshold=4096) as server:
        yield server


def run(env, *args, check=True):
    r = subprocess.run(list(args), env=env, capture_output=True, text=True, timeout=300)
    if check and r.returncode != 0:
        raise AssertionError(f"{args}: {r.returncode}\n{r.stdout}\n{r.stderr[-3000:]}")
    return r


def test_datasets_push_to_hub_and_load_dataset(hub, tmp_path):
    env = hub.client_env(token=TOKEN)
    env["HF_HOME"] = str(tmp_path / "home")
    script = """
import json, datasets
rows = [{"n": i, "text": f"line {i}", "tags": ["a"] * (i % 3)} for i in range(50)]
ds = datasets.Dataset.from_list(rows)
ds.push_to_hub("team/numbers", split="train")
ds.select(range(5)).push_to_hub("team/numbers", split="test")
back = datasets.load_dataset("team/numbers")
assert back["train"].to_list() == rows and back["test"].to_list() == rows[:5], back
print(json.dumps(sorted(back)))
"""
    assert json.loads(run(env, sys.executable, "-c", script).stdout.strip().splitlines()[-1]) == ["test", "train"]
    files = hub.files("team/numbers", "dataset")
    assert "data/train-00000-of-00001.parquet" in files and "README.md" in files
    assert "configs:" in files["README.md"].decode()  # push_to_hub wrote the configs into the card


def test_hf_cli_create_upload_download_with_branch(hub, tmp_path):
    env = hub.client_env(token=TOKEN)
    env["HF_HOME"] = str(tmp_path / "home")
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    (src / "notes.txt").write_text("hello\n")
    (src / "sub" / "weights.bin").write_bytes(bytes(range(256)) * 64)  # 16 KiB: goes to LFS
    hf = str(BIN / "hf")
    run(env, hf, "repos", "create", "alice/cli-model")
    run(env, hf, "upload", "alice/cli-model", str(src), ".", "--revision", "v1")  # creates the branch
    run(env, hf, "upload", "alice/cli-model", str(src), ".")
    assert sorted(hub.repo("alice/cli-model")["branches"]) == ["main", "v1"]
    for revision in ("main", "v1"):
        out = tmp_path / f"dl-{revision}"
        run(env, hf, "download", "alice/cli-model", "--revision", revision, "--local-dir", str(out))
        assert (out / "sub" / "weights.bin").read_bytes() == (src / "sub" / "weights.bin").read_bytes()
        assert (out / "notes.txt").read_text() == "hello\n"
    assert hub.repo("alice/cli-model")["commits"][hub.repo("alice/cli-model")["branches"]["main"]]["files"][
        "sub/weights.bin"]["lfs"]  # fmt: skip
    r = run(env, hf, "upload", "bob/elsewhere", str(src), ".", check=False)  # not alice's namespace
    assert r.returncode != 0


def test_in_process_clients_with_patched_endpoint(hub, tmp_path, monkeypatch):
    """`patched_hub_endpoint` points an already-imported huggingface_hub at the server."""
    import huggingface_hub
    from huggingface_hub import HfApi, HfFileSystem, hf_hub_download, snapshot_download
    from huggingface_hub.errors import EntryNotFoundError, RepositoryNotFoundError, RevisionNotFoundError

    monkeypatch.setenv("HF_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "cache"))
    with patched_hub_endpoint(hub.url):
        api = HfApi(token=TOKEN)
        api.create_repo("alice/private", private=True)
        api.upload_file(path_or_fileobj=b"x" * 10_000, path_in_repo="big.bin", repo_id="alice/private")
        api.upload_file(path_or_fileobj=b"small", path_in_repo="a/b.txt", repo_id="alice/private")
        path = hf_hub_download("alice/private", "big.bin", token=TOKEN, cache_dir=tmp_path / "cache")
        assert Path(path).read_bytes() == b"x" * 10_000
        snap = snapshot_download("alice/private", token=TOKEN, cache_dir=tmp_path / "cache")
        assert (Path(snap) / "a" / "b.txt").read_bytes() == b"small"
        fs = HfFileSystem(token=TOKEN, endpoint=hub.url)
        before = len(hub.requests)
        assert fs.cat_file("alice/private/big.bin", start=9_990, end=10_000) == b"x" * 10
        assert any(q["route"] == "resolve" and q["status"] == 206 for q in hub.requests[before:])  # a Range request
        assert sorted(fs.ls("alice/private", detail=False)) == ["alice/private/.gitattributes", "alice/private/a",
                                                                 "alice/private/big.bin"]  # fmt: skip
        with pytest.raises(RepositoryNotFoundError):
            HfApi(token=False).model_info("alice/private")  # private: invisible without a token
        with pytest.raises(RevisionNotFoundError):
            api.model_info("alice/private", revision="nope")
        with pytest.raises(EntryNotFoundError):
            hf_hub_download("alice/private", "missing.txt", token=TOKEN, cache_dir=tmp_path / "cache")
        with pytest.raises(ValueError, match="Invalid metadata"):
            api.upload_file(path_or_fileobj=b"---\nlicense: nope\n---\n", path_in_repo="README.md", repo_id="alice/private")
        assert [c.title for c in api.list_repo_commits("alice/private")][-1] == "initial commit"
    assert huggingface_hub.constants.ENDPOINT != hub.url  # restored


def test_xet_clients_are_told_to_disable_it(hub, tmp_path):
    env = hub.client_env(token=TOKEN)
    env.pop("HF_HUB_DISABLE_XET")
    env["HF_HOME"] = str(tmp_path / "home")
    script = (
        "from huggingface_hub import HfApi\n"
        "api = HfApi()\n"
        "api.create_repo('alice/x')\n"
        "api.upload_file(path_or_fileobj=b'\\0' * 5000, path_in_repo='w.bin', repo_id='alice/x')\n"
    )
    r = run(env, sys.executable, "-c", script, check=False)
    # hf_xet (Rust) reports only the status: 501 on the Xet token route, whose body says to disable Xet
    assert r.returncode != 0 and "501" in r.stderr and "xet-write-token" in r.stderr
    assert [q["status"] for q in hub.requests if "xet" in q["path"]] == [501]
