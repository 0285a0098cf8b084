"""A small Hugging Face Hub-compatible HTTP server for offline tests.

No PyPI package offers a local Hub that accepts uploads, so this module implements the part of the
Hub's HTTP API that ``huggingface_hub`` 2.4 (``HfApi``, ``upload_folder``, ``hf_hub_download``,
``snapshot_download``, ``HfFileSystem``), ``datasets`` (``push_to_hub``, ``load_dataset("org/name")``)
and the ``hf`` CLI (``hf repos create``, ``hf upload``, ``hf download``) use. The routes were read
from the client's source (``huggingface_hub/hf_api.py``, ``_commit_api.py``, ``lfs.py``,
``file_download.py``), not from the Hub's own code:

===========================================================  =========================================
route                                                        what it does here
===========================================================  =========================================
``GET  /api/whoami-v2``                                      the user owning the bearer token
``POST /api/repos/create`` / ``POST /api/repos/delete``      create (409 when it exists) / delete a repo
``POST /api/validate-yaml``                                  card metadata checks (:mod:`reterm.hub_metadata`)
``GET  /api/{type}s/{id}[/revision/{rev}]``                  repo info (sha, siblings, cardData)
``GET  /api/{type}s/{id}/refs`` · ``/commits/{rev}``         branches/tags · commit history
``GET  /api/{type}s/{id}/tree/{rev}[/{path}]``               tree listing (``recursive``)
``POST /api/{type}s/{id}/paths-info/{rev}``                  info about given paths
``POST /api/{type}s/{id}/preupload/{rev}``                   upload mode (regular/lfs) and remote oid
``POST /api/{type}s/{id}/commit/{rev}``                      ndjson commit: file, lfsFile, deletedFile/Folder
``POST|DELETE /api/{type}s/{id}/branch/{name}``              create (409 when it exists) / delete a branch
``POST /{prefix}{id}.git/info/lfs/objects/batch``            LFS batch API, ``basic`` transfer only
``PUT  /lfs-objects/{sha256}`` · ``POST /lfs-verify``        LFS object upload (checked against its sha256)
``GET|HEAD /{prefix}{id}/resolve/{rev}/{path}``              download with the Hub's headers; ``Range``
===========================================================  =========================================

It does not speak Xet: clients must run with ``HF_HUB_DISABLE_XET=1`` (the Xet routes answer 501
saying so), which makes ``upload_folder`` use one ``create_commit`` (preupload -> LFS batch/PUT ->
ndjson commit). Pull requests (``create_pr``) are refused with 501.

Behaviour kept from the Hub because tests rely on it: a new repo starts with a commit holding
``.gitattributes`` (LFS patterns); commits are atomic (an LFS file must be fully uploaded and match
its sha256 before a commit may reference it; a commit whose ``parentCommit`` is stale gets 412);
errors carry ``X-Error-Code`` (``RepoNotFound``, ``RevisionNotFound``, ``EntryNotFound``) so the
client raises its typed errors; private repos are invisible without a valid token.

State lives under ``root`` (``repos/{type}s/{id}/repo.json``, ``blobs/``, ``lfs/``) and survives a
restart with the same root. Faults can be injected to test interrupted uploads
(:meth:`HubServer.add_fault`).

Endpoint configuration, measured with huggingface_hub 2.4 / datasets 5.2: ``HF_ENDPOINT`` is read
once at import (``huggingface_hub.constants.ENDPOINT``, ``datasets.config.HF_ENDPOINT``) and the
module-level functions (``huggingface_hub.upload_folder`` ...) are bound to an ``HfApi`` created at
import. So either run the client in a subprocess with :meth:`HubServer.client_env` (what the tests
do), or pass ``endpoint=`` to ``HfApi``, or use :func:`patched_hub_endpoint` in-process.

Example::

    with HubServer(tmp_path / "hub", tokens={"hf_test": "tester"}) as hub:
        subprocess.run(["hf", "download", "tester/x"], env=hub.client_env(token="hf_test"))
"""

from __future__ import annotations

import base64
import contextlib
import fnmatch
import hashlib
import json
import os
import posixpath
import re
import tempfile
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Iterator
from urllib.parse import parse_qs, unquote, urlsplit

from reterm.hub_metadata import split_front_matter, validate_card_metadata

REPO_TYPES = ("model", "dataset", "space")
_PREFIX = {"model": "", "dataset": "datasets/", "space": "spaces/"}

# The Hub's default .gitattributes for new repos (LFS patterns), abridged to the common suffixes.
DEFAULT_GITATTRIBUTES = "".join(
    f"{pattern} filter=lfs diff=lfs merge=lfs -text\n"
    for pattern in (
        "*.7z *.arrow *.bin *.bz2 *.ckpt *.ftz *.gz *.h5 *.joblib *.lfs.* *.mlmodel *.model *.msgpack *.npy "
        "*.npz *.onnx *.ot *.parquet *.pb *.pickle *.pkl *.pt *.pth *.rar *.safetensors saved_model/**/* "
        "*.tar.* *.tar *.tflite *.tgz *.wasm *.xz *.zip *.zst *tfevents* *.gguf *.mp3 *.wav *.png *.jpg"
    ).split()
)
# Files above this size go to LFS even when no .gitattributes pattern matches (the Hub uses 10 MB).
DEFAULT_LFS_THRESHOLD = 10 * 1024 * 1024


def git_blob_oid(data: bytes) -> str:
    """git's object id of a blob (``git hash-object``): sha1 of ``b"blob {len}\\0" + data``."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def lfs_pointer(sha256: str, size: int) -> bytes:
    """The git-lfs pointer file stored in git in place of an LFS object."""
    return f"version https://git-lfs.github.com/spec/v1\noid sha256:{sha256}\nsize {size}\n".encode()


def _now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")[:-4] + "Z"


class HubError(Exception):
    """An HTTP error answer: status, message and the Hub's ``X-Error-Code`` (if any)."""

    def __init__(self, status: int, message: str, code: str | None = None, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.message, self.code, self.headers = status, message, code, headers or {}


@dataclass
class Fault:
    """An injected fault, consumed ``times`` times by requests whose route name is ``route``.

    Routes: ``create``, ``preupload``, ``commit``, ``lfs_batch``, ``lfs_put``, ``resolve``.
    Modes:
      - ``"error"``: answer 500 before doing anything.
      - ``"error_after"``: do the work (e.g. record the commit), then answer 500: a lost response.
      - ``"block"``: (``lfs_put`` only) read half of the body, set :attr:`reached`, then wait for
        :attr:`release` (or the client's disconnection); the partial object is discarded.
    """

    route: str
    mode: str = "error"
    times: int = 1
    reached: threading.Event = field(default_factory=threading.Event)
    release: threading.Event = field(default_factory=threading.Event)


class HubState:
    """Repos, commits and blobs on disk under ``root``; thread-safe through one lock."""

    def __init__(self, root: Path, lfs_threshold: int = DEFAULT_LFS_THRESHOLD):
        self.root = Path(root)
        self.lfs_threshold = lfs_threshold
        self.lock = threading.RLock()
        (self.root / "blobs").mkdir(parents=True, exist_ok=True)
        (self.root / "lfs").mkdir(parents=True, exist_ok=True)
        (self.root / "tmp").mkdir(parents=True, exist_ok=True)

    # ---------------------------------------------------------------------------------- storage
    def _repo_file(self, repo_type: str, repo_id: str) -> Path:
        return self.root / "repos" / f"{repo_type}s" / repo_id / "repo.json"

    def load_repo(self, repo_type: str, repo_id: str) -> dict[str, Any] | None:
        """The repo's record (``branches``, ``tags``, ``commits``, ``private``...) or None."""
        path = self._repo_file(repo_type, repo_id)
        return json.loads(path.read_text()) if path.exists() else None

    def save_repo(self, repo: dict[str, Any]) -> None:
        path = self._repo_file(repo["type"], repo["id"])
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
        with os.fdopen(fd, "w") as f:
            json.dump(repo, f)
        os.replace(tmp, path)

    def put_blob(self, data: bytes) -> str:
        oid = git_blob_oid(data)
        path = self.root / "blobs" / oid
        if not path.exists():
            self._write_atomic(path, data)
        return oid

    def _write_atomic(self, path: Path, data: bytes) -> None:
        fd, tmp = tempfile.mkstemp(dir=self.root / "tmp")
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)

    def lfs_path(self, sha256: str) -> Path:
        return self.root / "lfs" / sha256

    def has_lfs(self, sha256: str) -> bool:
        return bool(re.fullmatch(r"[0-9a-f]{64}", sha256)) and self.lfs_path(sha256).exists()

    def read_entry(self, entry: dict[str, Any]) -> Path:
        """Path of the bytes of a tree entry (LFS object or git blob)."""
        if entry.get("lfs"):
            return self.lfs_path(entry["lfs"]["oid"])
        return self.root / "blobs" / entry["oid"]

    # --------------------------------------------------------------------------------- repos
    def create_repo(self, repo_type: str, repo_id: str, private: bool, owner: str, sdk: str | None) -> dict:
        with self.lock:
            if self.load_repo(repo_type, repo_id) is not None:
                raise HubError(409, f"You already created this {repo_type} repo: {repo_id}")
            files: dict[str, dict[str, Any]] = {}
            data = DEFAULT_GITATTRIBUTES.encode()
            files[".gitattributes"] = {"oid": self.put_blob(data), "size": len(data), "lfs": None}
            repo = {
                "id": repo_id,
                "type": repo_type,
                "private": private,
                "owner": owner,
                "sdk": sdk,
                "created_at": _now(),
                "branches": {},
                "tags": {},
                "commits": {},
            }
            oid = self._add_commit(repo, None, files, "initial commit", "")
            repo["branches"]["main"] = oid
            self.save_repo(repo)
            return repo

    def _add_commit(self, repo: dict, parent: str | None, files: dict, summary: str, description: str) -> str:
        date = _now()
        payload = json.dumps([parent, sorted(files.items()), summary, description, date], sort_keys=True)
        oid = hashlib.sha1(payload.encode()).hexdigest()
        repo["commits"][oid] = {
            "oid": oid,
            "parents": [parent] if parent else [],
            "summary": summary,
            "description": description,
            "date": date,
            "files": files,
        }
        return oid

    @staticmethod
    def resolve_revision(repo: dict, revision: str) -> str:
        """Commit oid of a branch, tag, full oid or oid prefix (>= 7 hex); 404 RevisionNotFound else."""
        if revision in repo["branches"]:
            return repo["branches"][revision]
        if revision.startswith("refs/heads/") and revision[11:] in repo["branches"]:
            return repo["branches"][revision[11:]]
        if revision in repo["tags"]:
            return repo["tags"][revision]
        if re.fullmatch(r"[0-9a-f]{7,40}", revision):
            matches = [oid for oid in repo["commits"] if oid.startswith(revision)]
            if len(matches) == 1:
                return matches[0]
        raise HubError(404, f"Invalid rev id: {revision}", "RevisionNotFound")

    def commit(
        self,
        repo_type: str,
        repo_id: str,
        branch: str,
        operations: list[dict[str, Any]],
        summary: str,
        description: str,
        parent_commit: str | None,
    ) -> str:
        """Apply ``operations`` (parsed ndjson lines) on ``branch`` atomically; return the new oid."""
        with self.lock:
            repo = self.load_repo(repo_type, repo_id)
            if repo is None:
                raise HubError(404, "Repository not found", "RepoNotFound")
            if branch not in repo["branches"]:
                raise HubError(404, f"Invalid rev id: {branch} (commits go to existing branches)", "RevisionNotFound")
            head = repo["branches"][branch]
            if parent_commit and not head.startswith(parent_commit):
                raise HubError(412, f"A commit has happened since. Please refresh and try again. (head {head})")
            files = dict(repo["commits"][head]["files"])
            for op in operations:
                key, value = op.get("key"), op.get("value") or {}
                path = value.get("path", "")
                if not path or path.startswith("/") or ".." in path.split("/"):
                    raise HubError(400, f"Invalid path in commit: {path!r}")
                if key == "file":
                    if value.get("encoding") != "base64":
                        raise HubError(400, f"Unsupported encoding for {path}: {value.get('encoding')!r}")
                    data = base64.b64decode(value["content"])
                    files[path] = {"oid": self.put_blob(data), "size": len(data), "lfs": None}
                elif key == "lfsFile":
                    sha, size = value.get("oid", ""), value.get("size")
                    if value.get("algo", "sha256") != "sha256" or not self.has_lfs(sha):
                        raise HubError(422, f"LFS object {sha} of {path} was not uploaded")
                    actual = self.lfs_path(sha).stat().st_size
                    if size is not None and int(size) != actual:
                        raise HubError(422, f"LFS object {sha} of {path} has size {actual}, commit says {size}")
                    pointer = lfs_pointer(sha, actual)
                    files[path] = {
                        "oid": git_blob_oid(pointer),
                        "size": actual,
                        "lfs": {"oid": sha, "size": actual, "pointerSize": len(pointer)},
                    }
                elif key == "deletedFile":
                    if path not in files:
                        raise HubError(404, f"A file with this name doesn't exist: {path}", "EntryNotFound")
                    del files[path]
                elif key == "deletedFolder":
                    prefix = path.rstrip("/") + "/"
                    for p in [p for p in files if p.startswith(prefix)]:
                        del files[p]
                else:
                    raise HubError(400, f"Unknown commit operation {key!r}")
            oid = self._add_commit(repo, head, files, summary, description)
            repo["branches"][branch] = oid
            self.save_repo(repo)
            return oid

    def upload_mode(self, repo: dict, head_files: dict, path: str, size: int, sample: bytes) -> str:
        """``"lfs"`` when a .gitattributes LFS pattern matches, the file is binary or large; else regular."""
        if size >= self.lfs_threshold or b"\0" in sample:
            return "lfs"
        patterns = []
        entry = head_files.get(".gitattributes")
        if entry:
            for line in self.read_entry(entry).read_text(errors="replace").splitlines():
                parts = line.split()
                if len(parts) >= 2 and "filter=lfs" in parts[1:]:
                    patterns.append(parts[0])
        name = posixpath.basename(path)
        for pattern in patterns:
            target = path if "/" in pattern else name
            if fnmatch.fnmatch(target, pattern) or ("**" in pattern and fnmatch.fnmatch(path, pattern)):
                return "lfs"
        return "regular"


def _tree_entries(files: dict[str, dict[str, Any]], base: str, recursive: bool) -> list[dict[str, Any]]:
    """Entries of the tree under ``base`` ("" = root), directories first like the Hub."""
    prefix = base.rstrip("/") + "/" if base else ""
    out_files, out_dirs = [], {}
    for path, entry in sorted(files.items()):
        if not path.startswith(prefix):
            continue
        rest = path[len(prefix) :]
        parts = rest.split("/")
        for i in range(1, len(parts) if recursive else min(2, len(parts))):
            d = prefix + "/".join(parts[:i])
            out_dirs.setdefault(d, True)
        if recursive or len(parts) == 1:
            out_files.append(_file_info(path, entry))
    dirs = [_dir_info(d, files) for d in sorted(out_dirs)]
    return dirs + out_files


def _file_info(path: str, entry: dict[str, Any]) -> dict[str, Any]:
    info: dict[str, Any] = {"type": "file", "oid": entry["oid"], "size": entry["size"], "path": path}
    if entry.get("lfs"):
        info["lfs"] = dict(entry["lfs"])
    return info


def _dir_info(path: str, files: dict[str, dict[str, Any]]) -> dict[str, Any]:
    members = sorted((p, e["oid"]) for p, e in files.items() if p.startswith(path + "/"))
    return {"type": "directory", "oid": hashlib.sha1(json.dumps(members).encode()).hexdigest(), "size": 0, "path": path}


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: "_Server"

    # ------------------------------------------------------------------------------- plumbing
    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        pass  # requests are recorded in HubServer.requests instead

    def do_GET(self) -> None:
        self._dispatch("GET")

    def do_HEAD(self) -> None:
        self._dispatch("HEAD")

    def do_POST(self) -> None:
        self._dispatch("POST")

    def do_PUT(self) -> None:
        self._dispatch("PUT")

    def do_DELETE(self) -> None:
        self._dispatch("DELETE")

    @property
    def hub(self) -> "HubServer":
        return self.server.hub

    @property
    def base_url(self) -> str:
        return f"http://{self.headers.get('Host') or self.hub.host_port}"

    def _body_chunks(self) -> Iterator[bytes]:
        """The request body, de-chunked if needed, in pieces (read once)."""
        self._body_started = True
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            while True:
                size_line = self.rfile.readline()
                if not size_line:
                    raise ConnectionError("client went away")
                size = int(size_line.split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return
                data = self.rfile.read(size)
                if len(data) < size:
                    raise ConnectionError("client went away")
                self.rfile.readline()
                yield data
        else:
            remaining = int(self.headers.get("Content-Length") or 0)
            while remaining > 0:
                data = self.rfile.read(min(remaining, 1 << 20))
                if not data:
                    raise ConnectionError("client went away")
                remaining -= len(data)
                yield data

    def _body(self) -> bytes:
        if not hasattr(self, "_cached_body"):
            self._cached_body = b"".join(self._body_chunks())
        return self._cached_body

    def _json_body(self) -> Any:
        try:
            return json.loads(self._body() or b"{}")
        except json.JSONDecodeError as exc:
            raise HubError(400, f"Invalid JSON body: {exc}") from None

    def _send(self, status: int, body: bytes | None, headers: dict[str, str] | None = None, head: bool = False):
        if getattr(self, "_swallow", False):
            self._status = status
            return
        self.send_response(status)
        headers = {"Content-Type": "application/json", **(headers or {}), "Content-Length": str(len(body or b""))}
        for k, v in headers.items():
            self.send_header(k, v)
        self.end_headers()
        if body and not head:
            self.wfile.write(body)
        self._status = status

    def _json(self, status: int, obj: Any, headers: dict[str, str] | None = None) -> None:
        self._send(status, json.dumps(obj).encode(), headers, head=self.command == "HEAD")

    def _user(self) -> str | None:
        auth = self.headers.get("Authorization", "")
        if not auth.lower().startswith("bearer "):
            return None
        token = auth[7:].strip()
        self.hub._tokens_seen.add(token)
        if self.hub.tokens is None:
            return "user" if token else None
        return self.hub.tokens.get(token)

    def _require_user(self) -> str:
        user = self._user()
        if user is None:
            raise HubError(401, "Invalid credentials in Authorization header")
        return user

    def _repo(self, repo_type: str, repo_id: str) -> dict:
        repo = self.hub.state.load_repo(repo_type, repo_id)
        if repo is None or (repo["private"] and self._user() is None):
            raise HubError(404, "Repository not found", "RepoNotFound")
        return repo

    def _writable_repo(self, repo_type: str, repo_id: str) -> dict:
        user = self._require_user()
        repo = self._repo(repo_type, repo_id)
        namespace = repo_id.split("/")[0]
        if self.hub.tokens is not None and namespace not in (user, *self.hub.orgs.get(user, ())):
            raise HubError(403, f"You don't have the rights to write to {repo_id}")
        return repo

    # ------------------------------------------------------------------------------- dispatch
    def _dispatch(self, method: str) -> None:
        # One handler object serves every request of a keep-alive connection: reset per-request state.
        self.__dict__.pop("_cached_body", None)
        self._body_started = self._swallow = False
        self._status = 0
        split = urlsplit(self.path)
        self.query = parse_qs(split.query, keep_blank_values=True)
        raw_parts = [p for p in split.path.split("/") if p != ""]
        parts = [unquote(p) for p in raw_parts]
        started = time.monotonic()
        route = "unknown"
        try:
            route, handler, args = self._route(method, parts)
            fault = self.hub._take_fault(route)
            if fault is not None and fault.mode == "error":
                self._body()
                raise HubError(500, f"injected fault on {route}")
            if fault is not None and fault.mode == "error_after":
                self._swallow = True  # do the work, drop its answer, answer 500 instead
                handler(*args)
                self._swallow, self._status = False, 0
                raise HubError(500, f"injected fault on {route} (after the work was done)")
            if route == "lfs_put":
                handler(*args, fault=fault)
            else:
                handler(*args)
        except HubError as err:
            if not self._status:
                if getattr(self, "_body_started", False) and not hasattr(self, "_cached_body"):
                    self.close_connection = True  # body partly read: this connection cannot be reused
                else:
                    try:
                        self._body()
                    except ConnectionError:
                        self.close_connection = True
                        return
                headers = {"X-Error-Message": err.message, **err.headers}
                if err.code:
                    headers["X-Error-Code"] = err.code
                self._json(err.status, {"error": err.message}, headers)
        except (ConnectionError, BrokenPipeError, TimeoutError):
            self.close_connection = True
        finally:
            with self.hub._lock:
                self.hub.requests.append(
                    {"method": method, "path": split.path, "route": route, "status": self._status,
                     "seconds": round(time.monotonic() - started, 4)}  # fmt: skip
                )

    def _route(self, method: str, parts: list[str]):  # noqa: C901 - a flat route table reads best
        n = len(parts)
        if parts[:1] == ["api"]:
            if method == "GET" and parts[1:] == ["whoami-v2"]:
                return "whoami", self.h_whoami, ()
            if method == "POST" and parts[1:] == ["repos", "create"]:
                return "create", self.h_create, ()
            if method in ("POST", "DELETE") and parts[1:] == ["repos", "delete"]:
                return "delete", self.h_delete, ()
            if method == "POST" and parts[1:] == ["validate-yaml"]:
                return "validate_yaml", self.h_validate_yaml, ()
            if n >= 4 and parts[1] in ("models", "datasets", "spaces"):
                repo_type, repo_id, rest = parts[1][:-1], f"{parts[2]}/{parts[3]}", parts[4:]
                if method == "GET" and not rest:
                    return "info", self.h_info, (repo_type, repo_id, "main")
                if method == "GET" and len(rest) == 2 and rest[0] == "revision":
                    return "info", self.h_info, (repo_type, repo_id, rest[1])
                if method == "GET" and rest == ["refs"]:
                    return "refs", self.h_refs, (repo_type, repo_id)
                if method == "GET" and len(rest) == 2 and rest[0] == "commits":
                    return "commits", self.h_commits, (repo_type, repo_id, rest[1])
                if method == "GET" and len(rest) >= 2 and rest[0] == "tree":
                    return "tree", self.h_tree, (repo_type, repo_id, rest[1], "/".join(rest[2:]))
                if method == "POST" and len(rest) == 2 and rest[0] == "paths-info":
                    return "paths_info", self.h_paths_info, (repo_type, repo_id, rest[1])
                if method == "POST" and len(rest) == 2 and rest[0] == "preupload":
                    return "preupload", self.h_preupload, (repo_type, repo_id, rest[1])
                if method == "POST" and len(rest) == 2 and rest[0] == "commit":
                    return "commit", self.h_commit, (repo_type, repo_id, rest[1])
                if method in ("POST", "DELETE") and len(rest) == 2 and rest[0] == "branch":
                    return "branch", self.h_branch, (repo_type, repo_id, rest[1])
                if rest and rest[0].startswith("xet-"):
                    raise HubError(501, "This test server does not speak Xet: run the client with HF_HUB_DISABLE_XET=1")
        if method == "PUT" and n == 2 and parts[0] == "lfs-objects":
            return "lfs_put", self.h_lfs_put, (parts[1],)
        if method == "POST" and parts == ["lfs-verify"]:
            return "lfs_verify", self.h_lfs_verify, ()
        if method == "POST" and parts[-4:] == ["info", "lfs", "objects", "batch"]:
            repo_type, repo_path = self._split_prefixed(parts[:-4])
            if len(repo_path) == 2 and repo_path[1].endswith(".git"):
                return "lfs_batch", self.h_lfs_batch, (repo_type, f"{repo_path[0]}/{repo_path[1][:-4]}")
        if method in ("GET", "HEAD"):
            repo_type, repo_path = self._split_prefixed(parts)
            if len(repo_path) >= 5 and repo_path[2] == "resolve":
                return "resolve", self.h_resolve, (repo_type, "/".join(repo_path[:2]), repo_path[3], "/".join(repo_path[4:]))
        raise HubError(404, f"No such route in the test Hub server: {method} /{'/'.join(parts)}")

    @staticmethod
    def _split_prefixed(parts: list[str]) -> tuple[str, list[str]]:
        if parts[:1] == ["datasets"]:
            return "dataset", list(parts[1:])
        if parts[:1] == ["spaces"]:
            return "space", list(parts[1:])
        return "model", list(parts)

    # ------------------------------------------------------------------------------- handlers
    def h_whoami(self) -> None:
        user = self._require_user()
        orgs = [{"name": o, "type": "org"} for o in self.hub.orgs.get(user, ())]
        self._json(200, {"type": "user", "name": user, "fullname": user, "orgs": orgs,
                         "auth": {"type": "access_token", "accessToken": {"role": "write"}}})  # fmt: skip

    def h_create(self) -> None:
        user = self._require_user()
        body = self._json_body()
        name, org = body.get("name"), body.get("organization") or user
        repo_type = body.get("type") or "model"
        if repo_type not in REPO_TYPES:
            raise HubError(400, f"Invalid repo type {repo_type!r}")
        if not isinstance(name, str) or not re.fullmatch(r"[\w.-]{1,96}", name) or "--" in name:
            raise HubError(400, f"Invalid repo name {name!r}")
        if self.hub.tokens is not None and org not in (user, *self.hub.orgs.get(user, ())):
            raise HubError(403, f"You don't have the rights to create a repo under {org}")
        sdk = body.get("sdk")
        if repo_type == "space" and sdk not in ("gradio", "streamlit", "docker", "static"):
            raise HubError(400, f"Invalid sdk {sdk!r} for a Space")
        private = body.get("private") if "private" in body else body.get("visibility") == "private"
        repo_id = f"{org}/{name}"
        url = f"{self.base_url}/{_PREFIX[repo_type]}{repo_id}"
        try:
            self.hub.state.create_repo(repo_type, repo_id, bool(private), user, sdk)
        except HubError as err:
            if err.status == 409:
                self._json(409, {"error": err.message, "url": url}, {"X-Error-Message": err.message})
                return
            raise
        self._json(200, {"url": url, "name": repo_id, "id": repo_id})

    def h_delete(self) -> None:
        body = self._json_body()
        repo_type = body.get("type") or "model"
        repo_id = f"{body.get('organization') or self._require_user()}/{body.get('name')}"
        self._writable_repo(repo_type, repo_id)
        with self.hub.state.lock:
            path = self.hub.state._repo_file(repo_type, repo_id)
            path.unlink()
        self._json(200, {})

    def h_validate_yaml(self) -> None:
        body = self._json_body()
        content, repo_type = body.get("content", ""), body.get("repoType", "model")
        try:
            metadata, _ = split_front_matter(content)
        except ValueError as exc:
            self._json(400, {"errors": [{"message": str(exc)}]})
            return
        if not metadata:
            self._json(200, {"warnings": [{"message": "Empty metadata"}]})
            return
        errors = validate_card_metadata(metadata, repo_type)
        if errors:
            self._json(400, {"errors": [{"message": e} for e in errors]})
            return
        self._json(200, {"warnings": []})

    def h_info(self, repo_type: str, repo_id: str, revision: str) -> None:
        repo = self._repo(repo_type, repo_id)
        oid = self.hub.state.resolve_revision(repo, revision)
        commit = repo["commits"][oid]
        files = commit["files"]
        card = {}
        if "README.md" in files:
            try:
                card = split_front_matter(self.hub.state.read_entry(files["README.md"]).read_text())[0] or {}
            except (ValueError, UnicodeDecodeError):
                card = {}
        siblings = []
        for path, entry in sorted(files.items()):
            sib: dict[str, Any] = {"rfilename": path, "size": entry["size"], "blobId": entry["oid"]}
            if entry.get("lfs"):
                sib["lfs"] = {"size": entry["lfs"]["size"], "sha256": entry["lfs"]["oid"],
                              "pointerSize": entry["lfs"]["pointerSize"]}  # fmt: skip
            siblings.append(sib)
        info: dict[str, Any] = {
            "_id": hashlib.sha1(repo_id.encode()).hexdigest()[:24],
            "id": repo_id,
            "author": repo_id.split("/")[0],
            "sha": oid,
            "lastModified": commit["date"],
            "createdAt": repo["created_at"],
            "private": repo["private"],
            "disabled": False,
            "gated": False,
            "downloads": 0,
            "likes": 0,
            "tags": list(card.get("tags") or []) if isinstance(card.get("tags"), list) else [],
            "cardData": card,
            "siblings": siblings,
            "usedStorage": sum(e["size"] for e in files.values()),
        }
        if repo_type == "model":
            info["modelId"] = repo_id
            if isinstance(card.get("pipeline_tag"), str):
                info["pipeline_tag"] = card["pipeline_tag"]
            if isinstance(card.get("library_name"), str):
                info["library_name"] = card["library_name"]
        if repo_type == "space":
            info["sdk"] = card.get("sdk") or repo.get("sdk")
        self._json(200, info)

    def h_refs(self, repo_type: str, repo_id: str) -> None:
        repo = self._repo(repo_type, repo_id)
        self._json(200, {
            "branches": [{"name": b, "ref": f"refs/heads/{b}", "targetCommit": o} for b, o in repo["branches"].items()],
            "tags": [{"name": t, "ref": f"refs/tags/{t}", "targetCommit": o} for t, o in repo["tags"].items()],
            "converts": [],
            "pullRequests": [],
        })  # fmt: skip

    def h_commits(self, repo_type: str, repo_id: str, revision: str) -> None:
        repo = self._repo(repo_type, repo_id)
        oid: str | None = self.hub.state.resolve_revision(repo, revision)
        out = []
        while oid:
            c = repo["commits"][oid]
            out.append({"id": oid, "title": c["summary"], "message": c["description"], "date": c["date"],
                        "authors": [{"user": repo["owner"]}]})  # fmt: skip
            oid = c["parents"][0] if c["parents"] else None
        self._json(200, out)

    def _files_at(self, repo_type: str, repo_id: str, revision: str) -> tuple[str, dict[str, dict]]:
        repo = self._repo(repo_type, repo_id)
        oid = self.hub.state.resolve_revision(repo, revision)
        return oid, repo["commits"][oid]["files"]

    def h_tree(self, repo_type: str, repo_id: str, revision: str, path: str) -> None:
        oid, files = self._files_at(repo_type, repo_id, revision)
        path = path.strip("/")
        if path and path in files:
            raise HubError(400, f"{path} is a file, not a directory")
        recursive = (self.query.get("recursive") or ["false"])[0].lower() in ("1", "true")
        entries = _tree_entries(files, path, recursive)
        if path and not entries:
            raise HubError(404, f"Entry not found: {path}", "EntryNotFound", {"X-Repo-Commit": oid})
        self._json(200, entries, {"X-Repo-Commit": oid})

    def h_paths_info(self, repo_type: str, repo_id: str, revision: str) -> None:
        oid, files = self._files_at(repo_type, repo_id, revision)
        ctype = self.headers.get("Content-Type", "")
        if "json" in ctype:
            paths = self._json_body().get("paths", [])
        else:
            paths = parse_qs(self._body().decode(), keep_blank_values=True).get("paths", [])
        out = []
        for p in paths:
            p = p.strip("/")
            if p in files:
                out.append(_file_info(p, files[p]))
            elif p == "" or any(f.startswith(p + "/") for f in files):
                if p:
                    out.append(_dir_info(p, files))
        self._json(200, out, {"X-Repo-Commit": oid})

    def h_preupload(self, repo_type: str, repo_id: str, revision: str) -> None:
        repo = self._writable_repo(repo_type, repo_id)
        if self.query.get("create_pr"):
            raise HubError(501, "Pull requests are not supported by the test Hub server")
        oid = self.hub.state.resolve_revision(repo, revision) if revision in repo["branches"] else None
        if oid is None:
            raise HubError(404, f"Invalid rev id: {revision}", "RevisionNotFound")
        files = repo["commits"][oid]["files"]
        out = []
        for f in self._json_body().get("files", []):
            sample = base64.b64decode(f.get("sample", ""))
            mode = self.hub.state.upload_mode(repo, files, f["path"], int(f.get("size", 0)), sample)
            remote = files.get(f["path"])
            remote_oid = None
            if remote is not None:
                remote_oid = remote["lfs"]["oid"] if remote.get("lfs") else remote["oid"]
            out.append({"path": f["path"], "uploadMode": mode, "shouldIgnore": False, "oid": remote_oid})
        self._json(200, {"files": out, "commitOid": oid})

    def h_commit(self, repo_type: str, repo_id: str, revision: str) -> None:
        self._writable_repo(repo_type, repo_id)
        if self.query.get("create_pr"):
            raise HubError(501, "Pull requests are not supported by the test Hub server")
        lines = [json.loads(line) for line in self._body().splitlines() if line.strip()]
        if not lines or lines[0].get("key") != "header":
            raise HubError(400, "The commit payload must start with a header line")
        header = lines[0]["value"]
        oid = self.hub.state.commit(
            repo_type, repo_id, revision, lines[1:], header.get("summary") or "", header.get("description") or "",
            header.get("parentCommit"),
        )  # fmt: skip
        url = f"{self.base_url}/{_PREFIX[repo_type]}{repo_id}/commit/{oid}"
        self._json(200, {"success": True, "commitOid": oid, "commitUrl": url, "hookOutput": "", "pullRequestUrl": None})

    def h_branch(self, repo_type: str, repo_id: str, branch: str) -> None:
        repo = self._writable_repo(repo_type, repo_id)
        with self.hub.state.lock:
            repo = self.hub.state.load_repo(repo_type, repo_id)
            assert repo is not None
            if self.command == "DELETE":
                if branch not in repo["branches"] or branch == "main":
                    raise HubError(404 if branch != "main" else 403, f"Cannot delete branch {branch}")
                del repo["branches"][branch]
            else:
                if branch.startswith("refs/") or not re.fullmatch(r"[\w.\-/]+", branch):
                    raise HubError(400, f"Invalid reference for a branch: {branch}")
                if branch in repo["branches"]:
                    raise HubError(409, f"Reference already exists: refs/heads/{branch}")
                start = (self._json_body() or {}).get("startingPoint") or "main"
                repo["branches"][branch] = self.hub.state.resolve_revision(repo, start)
            self.hub.state.save_repo(repo)
        self._json(200, {})

    def h_lfs_batch(self, repo_type: str, repo_id: str) -> None:
        self._writable_repo(repo_type, repo_id)
        body = self._json_body()
        if body.get("operation") != "upload":
            raise HubError(400, "Only the LFS 'upload' operation is supported")
        objects = []
        for obj in body.get("objects", []):
            oid, size = obj.get("oid", ""), int(obj.get("size", 0))
            if not re.fullmatch(r"[0-9a-f]{64}", oid):
                objects.append({"oid": oid, "size": size, "error": {"code": 422, "message": "Invalid oid"}})
            elif self.hub.state.has_lfs(oid):
                objects.append({"oid": oid, "size": size})  # already there: no actions
            else:
                objects.append({
                    "oid": oid, "size": size, "authenticated": True,
                    "actions": {
                        "upload": {"href": f"{self.base_url}/lfs-objects/{oid}?size={size}"},
                        "verify": {"href": f"{self.base_url}/lfs-verify"},
                    },
                })  # fmt: skip
        self._json(200, {"transfer": "basic", "objects": objects, "hash_algo": "sha256"},
                   {"Content-Type": "application/vnd.git-lfs+json"})  # fmt: skip

    def h_lfs_put(self, sha256: str, fault: Fault | None = None) -> None:
        if not re.fullmatch(r"[0-9a-f]{64}", sha256):
            raise HubError(400, "Invalid oid")
        expected = int((self.query.get("size") or ["-1"])[0])
        digest, received = hashlib.sha256(), 0
        fd, tmp = tempfile.mkstemp(dir=self.hub.state.root / "tmp")
        try:
            with os.fdopen(fd, "wb") as f:
                for chunk in self._body_chunks():
                    f.write(chunk)
                    digest.update(chunk)
                    received += len(chunk)
                    if fault is not None and fault.mode == "block" and received >= max(1, expected // 2):
                        fault.reached.set()
                        fault.release.wait(timeout=60)
                        fault = None
            if digest.hexdigest() != sha256 or (expected >= 0 and received != expected):
                raise HubError(400, f"Uploaded content does not match oid {sha256} / size {expected}")
            os.replace(tmp, self.hub.state.lfs_path(sha256))
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
        self._send(200, b"", {"ETag": f'"{sha256}"'})

    def h_lfs_verify(self) -> None:
        body = self._json_body()
        oid = body.get("oid", "")
        if not self.hub.state.has_lfs(oid) or self.hub.state.lfs_path(oid).stat().st_size != body.get("size"):
            raise HubError(404, f"LFS object {oid} not found or wrong size")
        self._json(200, {"success": True})

    def h_resolve(self, repo_type: str, repo_id: str, revision: str, path: str) -> None:
        repo = self._repo(repo_type, repo_id)
        oid = self.hub.state.resolve_revision(repo, revision)
        entry = repo["commits"][oid]["files"].get(path)
        if entry is None:
            raise HubError(404, f"Entry not found: {path}", "EntryNotFound", {"X-Repo-Commit": oid})
        blob = self.hub.state.read_entry(entry)
        size = blob.stat().st_size
        headers = {"X-Repo-Commit": oid, "Accept-Ranges": "bytes", "Content-Type": "application/octet-stream"}
        if entry.get("lfs"):
            headers["ETag"] = f'"{entry["lfs"]["oid"]}"'
            headers["X-Linked-Etag"] = f'"{entry["lfs"]["oid"]}"'
            headers["X-Linked-Size"] = str(size)
        else:
            headers["ETag"] = f'"{entry["oid"]}"'
        start, end, status = 0, size - 1, 200
        rng = self.headers.get("Range")
        if rng:
            m = re.fullmatch(r"bytes=(\d*)-(\d*)", rng.strip())
            if not m or (not m.group(1) and not m.group(2)):
                raise HubError(416, f"Unsupported range {rng!r}")
            if m.group(1):
                start = int(m.group(1))
                end = min(int(m.group(2)), size - 1) if m.group(2) else size - 1
            else:
                start = max(0, size - int(m.group(2)))
            if start >= size and size > 0:
                raise HubError(416, f"Range {rng!r} not satisfiable (size {size})",
                               headers={"Content-Range": f"bytes */{size}"})  # fmt: skip
            status = 206
            headers["Content-Range"] = f"bytes {start}-{end}/{size}"
        length = max(0, end - start + 1)
        headers["Content-Length"] = str(length)
        self.send_response(status)
        for k, v in headers.items():
            self.send_header(k, v)
        self.end_headers()
        self._status = status
        if self.command == "HEAD":
            return
        with open(blob, "rb") as f:
            f.seek(start)
            remaining = length
            while remaining > 0:
                data = f.read(min(remaining, 1 << 20))
                if not data:
                    break
                self.wfile.write(data)
                remaining -= len(data)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    hub: "HubServer"


class HubServer:
    """A Hub-compatible server on ``127.0.0.1`` in a background thread of this process.

    Args:
        root: folder for the repos and blobs (created; reused across restarts).
        tokens: bearer token -> user name. ``None`` accepts any non-empty token as user ``"user"``.
            Writes always need a token; reads of public repos do not.
        orgs: user -> organisations the user may write to.
        port: TCP port (0 picks a free one).
        lfs_threshold: size in bytes from which files go to LFS regardless of .gitattributes.

    Attributes:
        url: the endpoint (``http://127.0.0.1:PORT``) to use as ``HF_ENDPOINT``.
        requests: one dict per request (``method``, ``path``, ``route``, ``status``, ``seconds``).
    """

    def __init__(
        self,
        root: str | Path,
        tokens: dict[str, str] | None = None,
        orgs: dict[str, list[str]] | None = None,
        port: int = 0,
        lfs_threshold: int = DEFAULT_LFS_THRESHOLD,
    ):
        self.state = HubState(Path(root), lfs_threshold=lfs_threshold)
        self.tokens = tokens
        self.orgs = orgs or {}
        self.requests: list[dict[str, Any]] = []
        self._faults: list[Fault] = []
        self._tokens_seen: set[str] = set()
        self._lock = threading.Lock()
        self._port = port
        self._httpd: _Server | None = None
        self._thread: threading.Thread | None = None

    # --------------------------------------------------------------------------------- control
    def start(self) -> "HubServer":
        """Bind and serve in a daemon thread; returns self."""
        self._httpd = _Server(("127.0.0.1", self._port), _Handler)
        self._httpd.hub = self
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="hub-server", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving and release the port; blocked faults are released first."""
        for fault in self._faults:
            fault.release.set()
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None

    def __enter__(self) -> "HubServer":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    @property
    def host_port(self) -> str:
        assert self._httpd is not None, "server not started"
        return f"127.0.0.1:{self._httpd.server_address[1]}"

    @property
    def url(self) -> str:
        return f"http://{self.host_port}"

    def add_fault(self, route: str, mode: str = "error", times: int = 1) -> Fault:
        """Inject a fault on the next ``times`` requests of ``route`` (see :class:`Fault`)."""
        fault = Fault(route=route, mode=mode, times=times)
        with self._lock:
            self._faults.append(fault)
        return fault

    def _take_fault(self, route: str) -> Fault | None:
        with self._lock:
            for fault in self._faults:
                if fault.route == route and fault.times > 0:
                    fault.times -= 1
                    return fault
        return None

    @property
    def tokens_seen(self) -> set[str]:
        """Bearer tokens received so far (to check that a client did authenticate)."""
        return set(self._tokens_seen)

    # ----------------------------------------------------------------------------- inspection
    def repo(self, repo_id: str, repo_type: str = "model") -> dict[str, Any] | None:
        """The stored record of a repo (branches, commits with their file tables) or None."""
        return self.state.load_repo(repo_type, repo_id)

    def files(self, repo_id: str, repo_type: str = "model", revision: str = "main") -> dict[str, bytes]:
        """``{path: content}`` of a repo at a revision, read from the server's storage."""
        repo = self.repo(repo_id, repo_type)
        if repo is None:
            raise KeyError(f"no {repo_type} repo {repo_id}")
        files = repo["commits"][HubState.resolve_revision(repo, revision)]["files"]
        return {p: self.state.read_entry(e).read_bytes() for p, e in files.items()}

    def history(self, repo_id: str, repo_type: str = "model", revision: str = "main") -> list[dict[str, Any]]:
        """Commits of a revision, newest first (``oid``, ``summary``, ``files``...)."""
        repo = self.repo(repo_id, repo_type)
        if repo is None:
            raise KeyError(f"no {repo_type} repo {repo_id}")
        out, oid = [], HubState.resolve_revision(repo, revision)
        while oid:
            out.append(repo["commits"][oid])
            parents = repo["commits"][oid]["parents"]
            oid = parents[0] if parents else None
        return out

    def client_env(self, token: str | None = None, base: dict[str, str] | None = None) -> dict[str, str]:
        """Environment for a client subprocess talking to this server.

        Sets ``HF_ENDPOINT``, ``HF_HUB_DISABLE_XET=1``, telemetry/progress-bar switches and, when
        given, ``HF_TOKEN``. ``base`` defaults to ``os.environ``; set ``HF_HOME`` yourself to isolate
        the cache.
        """
        env = dict(os.environ if base is None else base)
        env.update({
            "HF_ENDPOINT": self.url,
            "HF_HUB_DISABLE_XET": "1",
            "HF_HUB_DISABLE_TELEMETRY": "1",
            "HF_HUB_OFFLINE": "0",
            "HF_DATASETS_OFFLINE": "0",
            "HF_HUB_DISABLE_UPDATE_CHECK": "1",
            "NO_PROXY": "127.0.0.1,localhost",
        })  # fmt: skip
        env.pop("HF_HUB_ENABLE_HF_TRANSFER", None)
        if token is not None:
            env["HF_TOKEN"] = token
        else:
            env.pop("HF_TOKEN", None)
        return env


@contextlib.contextmanager
def patched_hub_endpoint(url: str) -> Iterator[None]:
    """Point an already-imported ``huggingface_hub``/``datasets`` at ``url`` (in this process).

    ``HF_ENDPOINT`` is only read at import time, so this patches what was derived from it:
    ``huggingface_hub.constants.ENDPOINT``, ``HUGGINGFACE_CO_URL_TEMPLATE``, ``HF_URL_HOSTS``,
    ``HF_HUB_DISABLE_XET`` (set, since the test server has no Xet), the default ``HfApi`` behind the
    module-level functions, and ``datasets.config.HF_ENDPOINT``/``HUB_DATASETS_URL`` when datasets is
    imported. Everything is restored on exit. Prefer a subprocess with
    :meth:`HubServer.client_env` when the code under test may create ``HfApi`` objects at import.
    """
    import sys

    from huggingface_hub import constants, hf_api

    saved: list[tuple[Any, str, Any]] = []

    def setattr_saved(obj: Any, name: str, value: Any) -> None:
        saved.append((obj, name, getattr(obj, name)))
        setattr(obj, name, value)

    url = url.rstrip("/")
    setattr_saved(constants, "ENDPOINT", url)
    setattr_saved(constants, "HUGGINGFACE_CO_URL_TEMPLATE", url + "/{repo_id}/resolve/{revision}/{filename}")
    setattr_saved(constants, "HF_URL_HOSTS", constants.HF_URL_HOSTS | {urlsplit(url).hostname})
    setattr_saved(constants, "HF_HUB_DISABLE_XET", True)
    setattr_saved(hf_api.api, "endpoint", url)
    if "datasets" in sys.modules:
        from datasets import config as ds_config

        setattr_saved(ds_config, "HF_ENDPOINT", url)
        setattr_saved(ds_config, "HUB_DATASETS_URL", url + "/datasets/{repo_id}/resolve/{revision}/{path}")
    try:
        yield
    finally:
        for obj, name, value in reversed(saved):
            setattr(obj, name, value)


def main(argv: list[str] | None = None) -> int:
    """``python tests/hub_server.py --root DIR [--port N] [--token TOKEN=USER ...]``: serve until Ctrl-C."""
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", required=True, type=Path, help="folder holding the repos and blobs")
    parser.add_argument("--port", type=int, default=0, help="TCP port on 127.0.0.1 (0: pick a free one)")
    parser.add_argument("--token", action="append", default=[], metavar="TOKEN=USER",
                        help="accepted bearer token and its user (repeat); none given: any token is user 'user'")  # fmt: skip
    args = parser.parse_args(argv)
    tokens = dict(t.split("=", 1) for t in args.token) or None
    with HubServer(args.root, tokens=tokens, port=args.port) as hub:
        print(f"HF_ENDPOINT={hub.url} HF_HUB_DISABLE_XET=1", flush=True)
        try:
            while True:
                time.sleep(3600)
        except KeyboardInterrupt:
            pass
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
