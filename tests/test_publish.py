"""`reterm publish` against the local Hub-compatible test server (reterm.testing.hub_server).

Every client runs as a subprocess with HF_ENDPOINT pointing at the server (huggingface_hub reads it at
import time): `reterm publish`, then `hf download` and `datasets.load_dataset` of what was published.
A fake token is set in HF_TOKEN; the tests check that it reached the server and appears nowhere else.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from huggingface_hub import DatasetCard, ModelCard

from reterm.testing.hub_server import HubServer

FIXTURES = Path(__file__).parent / "fixtures" / "publish"
RECIPES = [FIXTURES / "recipes" / "sft.yaml", FIXTURES / "recipes" / "grpo.yaml"]
RESULTS = FIXTURES / "results.json"
TOKEN = "hf_" + "PublishTestTokenAbcdefghijklmnopq12"  # fake, shaped like a real one (34 characters)
USER = "reterm"
REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def _fixture_module():
    spec = importlib.util.spec_from_file_location("publish_fixture", FIXTURES / "build_fixture.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def hub(tmp_path):
    with HubServer(tmp_path / "hub", tokens={TOKEN: USER}) as server:
        yield server


@pytest.fixture
def env(hub, tmp_path):
    env = hub.client_env(token=TOKEN)
    env["HF_HOME"] = str(tmp_path / "hf_home")
    env["HF_HUB_VERBOSITY"] = "debug"  # the most talkative logs: the token must not be in them either
    env["PYTHONUNBUFFERED"] = "1"
    env["TMPDIR"] = str(tmp_path / "tmp")  # publish's staging folders (a killed run leaves its own behind)
    (tmp_path / "tmp").mkdir()
    return env


@pytest.fixture(scope="module")
def dataset_folder(tmp_path_factory) -> Path:
    return _fixture_module().build_dataset(tmp_path_factory.mktemp("ds") / "reterm10k")


@pytest.fixture(scope="module")
def model_folder(tmp_path_factory) -> Path:
    """A tiny Llama checkpoint saved with save_pretrained (weights ~0.5 MB, enough to split an upload)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=256, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)  # fmt: skip
    out = tmp_path_factory.mktemp("model") / "checkpoint"
    LlamaForCausalLM(config).save_pretrained(out)
    (out / "training_summary.json").write_text(json.dumps({"method": "ReTerm-GRPO (TRL GRPOTrainer subclass)", "steps": 4}))
    return out


@pytest.fixture(scope="module")
def large_model_folder(tmp_path_factory) -> Path:
    """A checkpoint with 41 MB of weights: more than loopback socket buffers hold in flight, so killing the
    client while the server has read half of it really cuts the transfer."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=40_000, hidden_size=128, intermediate_size=256, num_hidden_layers=1,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)  # fmt: skip
    out = tmp_path_factory.mktemp("large") / "checkpoint"
    LlamaForCausalLM(config).save_pretrained(out)
    (out / "training_summary.json").write_text(json.dumps({"method": "SFT (TRL SFTTrainer)", "steps": 2}))
    return out


class Runs:
    """Runs clients in subprocesses and keeps their output (to look for the token afterwards)."""

    def __init__(self, env: dict[str, str], cwd: Path):
        self.env, self.cwd, self.outputs = env, cwd, []

    def __call__(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        r = subprocess.run(list(args), env=self.env, cwd=self.cwd, capture_output=True, text=True, timeout=300)
        self.outputs.append(r.stdout + r.stderr)
        if check and r.returncode != 0:
            raise AssertionError(f"{args} failed ({r.returncode}):\n{r.stdout}\n{r.stderr[-4000:]}")
        return r

    def publish(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        return self(sys.executable, "-m", "reterm.cli", "publish", *map(str, args), check=check)

    def hf_download(self, repo_id: str, repo_type: str, out: Path, *extra: str) -> Path:
        self(str(BIN / "hf"), "download", repo_id, "--repo-type", repo_type, "--local-dir", str(out), *extra)
        return out

    def assert_no_token(self) -> None:
        for text in self.outputs:
            assert TOKEN not in text


@pytest.fixture
def runs(env, tmp_path):
    r = Runs(env, tmp_path)
    yield r
    r.assert_no_token()


def tree(folder: Path) -> dict[str, bytes]:
    """Files under ``folder`` (hf download's .cache folder left out) -> bytes."""
    return {
        p.relative_to(folder).as_posix(): p.read_bytes()
        for p in sorted(folder.rglob("*"))
        if p.is_file() and ".cache" not in p.relative_to(folder).parts
    }


def assert_no_token_in(*folders: Path) -> None:
    needle = TOKEN.encode()
    for folder in folders:
        for path in folder.rglob("*"):
            if path.is_file():
                assert needle not in path.read_bytes(), path


def publish_commits(hub: HubServer, repo_id: str, repo_type: str, revision: str = "main") -> list[str]:
    return [c["summary"] for c in hub.history(repo_id, repo_type, revision) if c["summary"] != "initial commit"]


# ------------------------------------------------------------------------------------- dataset
def test_publish_dataset_then_hf_download_and_load_dataset(hub, runs, dataset_folder, tmp_path):
    repo = f"{USER}/ReTerm-10K"
    stage = tmp_path / "stage"
    out = runs.publish("dataset", "--repo-id", repo, "--folder", dataset_folder, "--dry-run", "--stage-dir", stage)
    assert Path(out.stdout.strip()) == stage.resolve()
    assert hub.requests == []  # a dry run sends nothing
    staged = tree(stage)
    assert sorted(staged) == ["README.md", "data/test-00000-of-00001.parquet", "data/train-00000-of-00001.parquet",
                              "stats.json"]  # fmt: skip

    out = runs.publish("dataset", "--repo-id", repo, "--folder", dataset_folder, "--private")
    assert out.stdout.strip().startswith(f"{hub.url}/datasets/{repo}/commit/")
    assert TOKEN in hub.tokens_seen  # the token from HF_TOKEN authenticated the upload
    remote = hub.files(repo, "dataset")
    assert remote.pop(".gitattributes")
    assert remote == staged  # the dry run's folder is exactly what was uploaded
    assert hub.repo(repo, "dataset")["private"] is True
    # the parquet shards went through LFS, the card and stats as regular files
    files = hub.repo(repo, "dataset")["commits"][hub.history(repo, "dataset")[0]["oid"]]["files"]
    assert files["data/train-00000-of-00001.parquet"]["lfs"] and not files["README.md"]["lfs"]

    downloaded = tree(runs.hf_download(repo, "dataset", tmp_path / "dl"))
    assert downloaded.pop(".gitattributes")
    assert downloaded == staged
    card = DatasetCard.load(tmp_path / "dl" / "README.md")
    assert card.data.to_dict() == DatasetCard.load(stage / "README.md").data.to_dict()

    script = (
        "import json, datasets\n"
        f"d = datasets.load_dataset({repo!r})\n"
        "print(json.dumps({s: d[s].to_list() for s in d}))\n"
    )
    rows = json.loads(runs(sys.executable, "-c", script).stdout.strip().splitlines()[-1])
    expected = {s: pq.read_table(dataset_folder / "data" / f"{s}-00000-of-00001.parquet").to_pylist() for s in ("train", "test")}
    assert rows == expected
    assert_no_token_in(stage, hub.state.root, tmp_path / "dl")


def test_republishing_a_dataset_replaces_stale_shards(hub, runs, dataset_folder, tmp_path):
    """A rebuilt dataset with a different sharding leaves no old shard behind (no duplicated rows)."""
    from dataset_card.layout import write_dataset_folder

    fixture = _fixture_module()
    records = [fixture.make_record(s) for s in fixture.SPECS]
    two_shards = tmp_path / "v1"
    write_dataset_folder(two_shards, {"train": records[:4], "test": records[4:]}, fixture.stats_dict(), max_shard_bytes=2000)
    assert len(list((two_shards / "data").glob("train-*"))) > 1
    repo = f"{USER}/ReTerm-10K-shards"
    runs.publish("dataset", "--repo-id", repo, "--folder", two_shards)
    runs.publish("dataset", "--repo-id", repo, "--folder", dataset_folder)
    remote = hub.files(repo, "dataset")
    assert sorted(p for p in remote if p.startswith("data/")) == ["data/test-00000-of-00001.parquet",
                                                                 "data/train-00000-of-00001.parquet"]  # fmt: skip
    assert publish_commits(hub, repo, "dataset") == ["Publish dataset with `reterm publish`"] * 2
    n = runs(sys.executable, "-c", f"import datasets; print(len(datasets.load_dataset({repo!r}, split='train')))")
    assert n.stdout.strip().splitlines()[-1] == "4"


def test_a_token_in_the_data_is_refused_before_any_request(hub, runs, tmp_path):
    fixture = _fixture_module()
    from dataset_card.layout import write_dataset_folder

    records = [fixture.make_record(s) for s in fixture.SPECS]
    leaked = "hf_" + "Zz" * 17  # another token-shaped string (not the one in use)
    records[2]["failure_output"] = f"$ env\nHF_TOKEN={leaked}\n[exit status: 0]"
    folder = tmp_path / "leaky"
    write_dataset_folder(folder, {"train": records[:4], "test": records[4:]}, fixture.stats_dict())
    r = runs.publish("dataset", "--repo-id", f"{USER}/leaky", "--folder", folder, check=False)
    assert r.returncode == 1
    assert "data/train-00000-of-00001.parquet row 2" in r.stderr and "shaped like a Hugging Face token" in r.stderr
    assert leaked not in r.stderr + r.stdout
    assert hub.requests == []


def test_malformed_metadata_fails_before_any_request(hub, runs, tmp_path, dataset_folder):
    space = tmp_path / "space"
    space.mkdir()
    (space / "app.py").write_text("print('hi')\n")
    (space / "README.md").write_text("---\ntitle: x\nsdk: flask\nlicense: apache-2.0\n---\n# x\n")
    r = runs.publish("space", "--repo-id", f"{USER}/bad-space", "--folder", space, check=False)
    assert r.returncode == 1 and '"sdk" must be one of gradio' in r.stderr
    bad = tmp_path / "ds"
    import shutil

    shutil.copytree(dataset_folder, bad)
    stats = json.loads((bad / "stats.json").read_text())
    stats["license"] = "free-for-all"
    (bad / "stats.json").write_text(json.dumps(stats))
    r = runs.publish("dataset", "--repo-id", f"{USER}/bad-ds", "--folder", bad, check=False)
    assert r.returncode == 1 and "'free-for-all' is not a Hub licence id" in r.stderr
    assert hub.requests == []


# --------------------------------------------------------------------------------------- model
def _publish_model(runs, folder: Path, repo: str, *extra: str, check: bool = True):
    return runs.publish("model", "--repo-id", repo, "--folder", folder, "--recipe", RECIPES[0], "--recipe", RECIPES[1],
                        "--results", RESULTS, "--eval-name", "reterm-grpo", "--dataset", f"{USER}/ReTerm-10K",
                        *extra, check=check)  # fmt: skip


def test_publish_model_and_checkpoint_branches(hub, runs, model_folder, tmp_path):
    repo = f"{USER}/ReTerm-tiny"
    stage = tmp_path / "stage"
    _publish_model(runs, model_folder, repo, "--dry-run", "--stage-dir", stage)
    staged = tree(stage)
    assert sorted(staged) == ["README.md", "config.json", "eval/results.json", "generation_config.json",
                              "model.safetensors", "recipes/1-sft-sft.yaml", "recipes/2-grpo-grpo.yaml",
                              "training_summary.json"]  # fmt: skip
    assert b"fixture-secret-value" not in staged["recipes/1-sft-sft.yaml"]

    _publish_model(runs, model_folder, repo)
    for step in ("step-1", "step-2"):
        _publish_model(runs, model_folder, repo, "--revision", step)
    _publish_model(runs, model_folder, repo, "--revision", "step-2")  # re-run: nothing new to commit
    refs = hub.repo(repo)["branches"]
    assert sorted(refs) == ["main", "step-1", "step-2"]
    assert publish_commits(hub, repo, "model", "step-2") == ["Publish model with `reterm publish`"]
    assert publish_commits(hub, repo, "model", "main") == ["Publish model with `reterm publish`"]

    for revision in ("main", "step-2"):
        out = runs.hf_download(repo, "model", tmp_path / f"dl-{revision}", "--revision", revision)
        downloaded = tree(out)
        assert downloaded.pop(".gitattributes")
        assert downloaded == staged
    card = ModelCard.load(tmp_path / "dl-main" / "README.md")
    assert card.data.to_dict() == ModelCard.load(stage / "README.md").data.to_dict()
    assert card.data.eval_results[0].metric_value == 34.8
    assert card.data.base_model == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert card.data["base_model_relation"] == "finetune"
    # the downloaded checkpoint loads
    from transformers import AutoModelForCausalLM

    assert AutoModelForCausalLM.from_pretrained(tmp_path / "dl-step-2").num_parameters() > 0
    assert_no_token_in(stage, hub.state.root, tmp_path / "dl-main")


def test_killed_upload_rerun_neither_duplicates_nor_corrupts(hub, env, runs, large_model_folder, tmp_path):
    """The upload is killed (SIGKILL) while the weights are half sent; the re-run completes it."""
    model_folder = large_model_folder
    repo = f"{USER}/ReTerm-killed"
    fault = hub.add_fault("lfs_put", mode="block")
    args = [sys.executable, "-m", "reterm.cli", "publish", "model", "--repo-id", repo, "--folder", str(model_folder),
            "--recipe", str(RECIPES[0]), "--base-model", "HuggingFaceTB/SmolLM2-135M-Instruct"]  # fmt: skip
    proc = subprocess.Popen(args, env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        assert fault.reached.wait(120), "the upload never reached the LFS transfer"
        proc.kill()
        output = proc.communicate(timeout=30)[0].decode()
    finally:
        fault.release.set()
    runs.outputs.append(output)
    assert proc.returncode != 0
    _wait_for_no_partial_uploads(hub)  # the server drops the cut transfer
    cut = [q for q in hub.requests if q["route"] == "lfs_put"]
    assert [q["status"] for q in cut] == [0]  # the transfer was cut: never answered
    assert not any((hub.state.root / "lfs").iterdir())  # and the partial object was not kept
    assert publish_commits(hub, repo, "model") == []  # nothing half-committed

    runs.publish("model", "--repo-id", repo, "--folder", model_folder, "--recipe", RECIPES[0],
                 "--base-model", "HuggingFaceTB/SmolLM2-135M-Instruct")  # fmt: skip
    assert publish_commits(hub, repo, "model") == ["Publish model with `reterm publish`"]
    remote = hub.files(repo)
    for name in ("model.safetensors", "config.json"):
        assert remote[name] == (model_folder / name).read_bytes()
    _assert_lfs_objects_intact(hub)
    _wait_for_no_partial_uploads(hub)


def _wait_for_no_partial_uploads(hub: HubServer, timeout: float = 20) -> None:
    tmp = hub.state.root / "tmp"
    deadline = time.time() + timeout
    while any(tmp.iterdir()) and time.time() < deadline:
        time.sleep(0.1)
    assert not any(tmp.iterdir()), "a partial upload was left on the server"


def _assert_lfs_objects_intact(hub: HubServer) -> None:
    for obj in (hub.state.root / "lfs").iterdir():
        assert hashlib.sha256(obj.read_bytes()).hexdigest() == obj.name, obj


def test_lost_commit_answer_rerun_makes_no_second_commit(hub, runs, model_folder):
    """The Hub records the commit but the answer is lost (HTTP 500): the re-run finds nothing to do."""
    repo = f"{USER}/ReTerm-lost"
    hub.add_fault("commit", mode="error_after")
    args = ("--recipe", RECIPES[1], "--base-model", "HuggingFaceTB/SmolLM2-135M-Instruct")
    r = runs.publish("model", "--repo-id", repo, "--folder", model_folder, *args, check=False)
    assert r.returncode == 1 and "500" in r.stderr
    assert publish_commits(hub, repo, "model") == ["Publish model with `reterm publish`"]
    head = hub.repo(repo)["branches"]["main"]
    r = runs.publish("model", "--repo-id", repo, "--folder", model_folder, *args)
    assert r.stdout.strip().endswith(head)  # the existing commit, not a new one
    assert publish_commits(hub, repo, "model") == ["Publish model with `reterm publish`"]


def test_failed_commit_rerun_succeeds(hub, runs, dataset_folder):
    """A commit refused once (server error before doing anything): the re-run publishes once."""
    repo = f"{USER}/ReTerm-retry"
    hub.add_fault("commit", mode="error")
    assert runs.publish("dataset", "--repo-id", repo, "--folder", dataset_folder, check=False).returncode == 1
    assert publish_commits(hub, repo, "dataset") == []
    runs.publish("dataset", "--repo-id", repo, "--folder", dataset_folder)
    assert publish_commits(hub, repo, "dataset") == ["Publish dataset with `reterm publish`"]


# --------------------------------------------------------------------------------------- space
def test_publish_space_then_hf_download(hub, runs, tmp_path):
    repo = f"{USER}/ReTerm-demo"
    runs.publish("space", "--repo-id", repo, "--folder", FIXTURES / "space")
    assert hub.repo(repo, "space")["sdk"] == "gradio"
    out = runs.hf_download(repo, "space", tmp_path / "dl")
    downloaded = tree(out)
    assert downloaded.pop(".gitattributes")
    own = tree(FIXTURES / "space")
    assert {k: downloaded[k] for k in own} == own
    # the kit travels with the Space (no `reterm` package on the Hub): library, eval and the task suite
    kit = {k for k in downloaded if k not in own}
    assert {k.split("/")[0] for k in kit} == {"reterm", "eval", "tasks"}
    assert "reterm/agent/protocol.py" in kit and "tasks/splits.json" in kit
    assert not any("__pycache__" in k for k in kit)
    code = "import reterm.agent.protocol as p, eval.metrics as m; print(p.__file__); print(m.__file__)"
    r = subprocess.run([sys.executable, "-c", code], cwd=out, env={**os.environ, "PYTHONPATH": str(out)},
                       capture_output=True, text=True)  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert all(Path(f).resolve().is_relative_to(out.resolve()) for f in r.stdout.split()), r.stdout


def test_publish_without_a_token_says_how_to_log_in(hub, env, tmp_path, dataset_folder):
    env = dict(env)
    env.pop("HF_TOKEN")
    env["HF_HOME"] = str(tmp_path / "empty_home")  # no stored login either
    r = subprocess.run([sys.executable, "-m", "reterm.cli", "publish", "dataset", "--repo-id", f"{USER}/x",
                        "--folder", str(dataset_folder)], env=env, cwd=tmp_path, capture_output=True, text=True)  # fmt: skip
    assert r.returncode == 1 and "hf auth login" in r.stderr and "HF_TOKEN" in r.stderr
    assert hub.requests == []


@pytest.mark.slow
def test_publish_smollm2_checkpoint(hub, runs, tmp_path):
    """The SmolLM2-135M weights (538 MB) laid out as train/sft.py writes a run (training_summary.json and
    recipe.yaml in the output folder, the checkpoint in merged/) publish without --recipe or --base-model and
    round-trip through hf download; the same weights as they come (no training record) are refused when a
    recipe would call them an SFT checkpoint."""
    from reterm.policies.smollm2 import embedded_model_path

    embedded = embedded_model_path()
    refused = runs.publish("model", "--repo-id", f"{USER}/untrained", "--folder", embedded, "--recipe", RECIPES[0],
                           "--base-model", "HuggingFaceTB/SmolLM2-135M-Instruct", check=False)  # fmt: skip
    assert refused.returncode == 1 and "no training_summary.json" in refused.stderr
    assert "trained with SFT" in refused.stderr and hub.repo(f"{USER}/untrained") is None

    run = tmp_path / "run" / "sft"
    folder = run / "merged"
    folder.mkdir(parents=True)
    for path in embedded.iterdir():
        if path.is_file():
            os.link(path, folder / path.name)
    (run / "recipe.yaml").write_bytes((REPO / "train" / "recipes" / "smollm2-135m" / "sft.yaml").read_bytes())
    (run / "training_summary.json").write_text(json.dumps({
        "base_model": "smollm2", "base_model_hub_id": "HuggingFaceTB/SmolLM2-135M-Instruct",
        "method": "SFT (TRL SFTTrainer)", "steps": 5, "dataset": "reterm10k_mini"}))  # fmt: skip
    repo = f"{USER}/SmolLM2-135M-ReTerm"
    runs.publish("model", "--repo-id", repo, "--folder", folder)
    out = runs.hf_download(repo, "model", tmp_path / "dl")

    def digest(path: Path) -> str:
        h = hashlib.sha256()
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
        return h.hexdigest()

    published = {p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()} - {"README.md"}
    got = {p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file() and ".cache" not in p.parts}
    assert got - published == {".gitattributes", "README.md", "recipes/1-sft-recipe.yaml", "training_summary.json"}
    for rel in published:
        assert digest(folder / rel) == digest(out / rel), rel
    card = ModelCard.load(out / "README.md")
    assert card.data.base_model == "HuggingFaceTB/SmolLM2-135M-Instruct" and "sft" in card.data.tags