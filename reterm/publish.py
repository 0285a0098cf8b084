"""``reterm publish dataset|model|space``: stage a folder with its rendered card and upload it to the Hub.

Usage::

    reterm publish dataset --repo-id ORG/ReTerm-10K --folder outputs/reterm10k [--private] [--dry-run]
    reterm publish model   --repo-id ORG/ReTerm-9B  --folder outputs/grpo/merged \\
        [--recipe train/recipes/qwen3.5-9b/sft.yaml --recipe train/recipes/qwen3.5-9b/grpo.yaml] \\
        --results outputs/eval/results.json [--eval-name reterm-grpo] [--dataset ORG/ReTerm-10K] \\
        [--revision step-500]
    reterm publish space   --repo-id ORG/ReTerm-demo [--folder space]

Every kind goes through the same steps:

1. **Stage.** The files to publish (``--include``/``--exclude``, with defaults per kind) are placed in a
   staging folder (hard links, falling back to symbolic links or copies) with the rendered card as
   ``README.md``: :func:`reterm.cards.dataset.render_dataset_card` from ``stats.json`` and the shards,
   :func:`reterm.cards.model.render_model_card` from the checkpoint's own training record
   (``training_summary.json`` and ``recipe.yaml`` in the folder or its parent; ``--recipe`` replaces the
   recipes) and ``results.json`` (recipes, results and the training summary are also staged as
   ``recipes/``, ``eval/results.json`` and ``training_summary.json``, so a staged folder publishes again
   as it is), and the Space's own ``README.md`` for a Space. A model folder without a training record
   (untrained weights) is refused.
2. **Check.** The card's metadata is validated (:mod:`reterm.hub_metadata`) and every staged text file,
   card and dataset row is scanned for Hugging Face tokens (the one in use and anything shaped like
   ``hf_...``). A problem stops here, before any request to the Hub.
3. **Dry run** (``--dry-run``): the staging folder is left in place (default
   ``outputs/publish/{kind}/{ORG}--{NAME}[@REVISION]``, or ``--stage-dir``) and its path printed; nothing
   is sent, no token needed. What it holds is exactly what would be uploaded.
4. **Upload.** ``create_repo(exist_ok=True)`` (``--private`` for a new repo; a Space gets the SDK named in
   its README), ``create_branch(exist_ok=True)`` when ``--revision`` names a branch other than ``main``
   (one branch per checkpoint step: ``--revision step-500``), then ``upload_folder``. Remote files matching
   the kind's delete patterns (``data/*`` for a dataset, weight files for a model) and absent from the
   staging folder are deleted in the same commit, so a re-published dataset never keeps stale shards.

Re-running after an interruption is safe: a commit is atomic on the Hub (an interrupted upload leaves no
partial commit), files already on the Hub with the same content are skipped (no duplicate commit, no
empty commit), LFS/Xet content already uploaded is not sent again, and ``upload_folder`` resumes
multi-commit uploads. The token comes from ``HF_TOKEN`` or ``hf auth login`` (``huggingface_hub.get_token``);
it is never printed, logged or written (there is deliberately no ``--token`` flag: it would end up in shell
history and process lists).

Written for this kit where ``huggingface_hub`` has no equivalent: staging with rendered cards, the secret
scan and the per-kind defaults. Everything talking to the Hub is ``huggingface_hub.HfApi``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from reterm.cards.dataset import render_dataset_card
from reterm.cards.model import render_model_card, training_record
from reterm.cards.model_inputs import load_recipe
from reterm.hub_metadata import check_readme

KINDS = ("dataset", "model", "space")

# Default allow-list (None = every file) and deny-list per kind, matched like `hf upload` (fnmatch,
# `*` crosses folders) against paths relative to --folder. README.md is always the rendered card.
DEFAULT_INCLUDE: dict[str, list[str] | None] = {
    "dataset": ["data/*.parquet", "stats.json", "config.yaml", "LICENSE*"],
    "model": None,
    "space": None,
}
DEFAULT_EXCLUDE: dict[str, list[str]] = {
    "dataset": [],
    "model": [
        "optimizer.pt", "scheduler.pt", "rng_state*.pth", "training_args.bin", "trainer_state.json",
        "checkpoint-*", "runs/*", "*.lock", "__pycache__/*",
        "command.json",  # the command line of this machine (its paths); recipe + training_summary.json say it
    ],
    "space": ["__pycache__/*", "*.pyc", ".venv/*", "flagged/*", ".gradio/*", ".env"],
}  # fmt: skip
DEFAULT_DELETE: dict[str, list[str]] = {
    "dataset": ["data/*"],
    "model": ["*.safetensors", "*.safetensors.index.json", "*.bin", "*.gguf"],
    "space": [],
}
ALWAYS_EXCLUDE = [".git/*", ".cache/huggingface/*", "README.md", ".DS_Store"]

# A Hugging Face user access token: "hf_" then 34 letters/digits (older tokens are longer, so 30+).
TOKEN_PATTERN = re.compile(r"hf_[A-Za-z0-9]{30,}")
TEXT_SUFFIXES = {".md", ".json", ".jsonl", ".yaml", ".yml", ".txt", ".py", ".toml", ".cfg", ".ini", ".csv",
                 ".jinja", ".sh", ".html", ".js", ".css", ".env", ""}  # fmt: skip
MAX_SCAN_BYTES = 64 * 1024 * 1024


class PublishError(Exception):
    """A problem with the inputs or the staged folder; the message says what and where."""


def log(message: str) -> None:
    """Progress on stderr (never anything secret)."""
    print(f"[publish] {message}", file=sys.stderr, flush=True)


@dataclass
class Staged:
    """A staging folder ready to upload.

    Attributes:
        path: the folder.
        files: paths relative to ``path`` (sorted), README.md included.
        card: the README's metadata.
        space_sdk: the Space SDK (``sdk`` of the README) for Spaces.
    """

    path: Path
    files: list[str]
    card: dict[str, Any]
    space_sdk: str | None = None
    bytes: int = 0
    notes: list[str] = field(default_factory=list)


# ------------------------------------------------------------------------------------ staging
def select_files(folder: Path, include: list[str] | None, exclude: list[str]) -> list[str]:
    """Files under ``folder`` (relative posix paths) passing ``include``/``exclude`` (like ``hf upload``)."""
    from huggingface_hub.utils import filter_repo_objects

    rel = sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())
    return list(filter_repo_objects(rel, allow_patterns=include, ignore_patterns=exclude + ALWAYS_EXCLUDE))


def _place(src: Path, dst: Path, allow_symlink: bool) -> None:
    """Hard-link ``src`` at ``dst``; else symlink (when allowed) or copy."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(src, dst)
        return
    except OSError:
        pass
    if allow_symlink:
        os.symlink(src.resolve(), dst)
    else:
        shutil.copy2(src, dst)


def stage(
    kind: str,
    folder: str | Path,
    repo_id: str,
    stage_dir: str | Path,
    *,
    include: list[str] | None = None,
    exclude: list[str] | None = None,
    allow_symlink: bool = False,
    card_options: dict[str, Any] | None = None,
) -> Staged:
    """Build the staging folder of ``folder`` for ``repo_id`` (see the module docstring).

    Args:
        kind: ``"dataset"``, ``"model"`` or ``"space"``.
        folder: the source folder.
        repo_id: ``ORG/NAME``.
        stage_dir: an empty or missing folder to fill.
        include: allow-list patterns (default: the kind's :data:`DEFAULT_INCLUDE`).
        exclude: extra deny-list patterns (added to :data:`DEFAULT_EXCLUDE`).
        allow_symlink: allow symbolic links when hard links fail (fine for an upload, not for a dry run
            that should stand alone).
        card_options: model cards: ``recipes``, ``results``, ``eval_name``, ``base_model``, ``datasets``,
            ``license``.

    Raises:
        PublishError: bad kind, repo id, folder, stage folder, card inputs or metadata.
    """
    if kind not in KINDS:
        raise PublishError(f"kind must be one of {', '.join(KINDS)}, got {kind!r}")
    if not re.fullmatch(r"[A-Za-z0-9][\w.-]*/[\w.-]+", repo_id) or "--" in repo_id or ".." in repo_id:
        raise PublishError(f"--repo-id must be ORG/NAME (letters, digits, '-', '_', '.'), got {repo_id!r}")
    folder = Path(folder)
    if not folder.is_dir():
        raise PublishError(f"--folder {folder}: not a folder")
    stage_dir = Path(stage_dir)
    if stage_dir.exists() and any(stage_dir.iterdir()):
        raise PublishError(f"staging folder {stage_dir} is not empty")
    stage_dir.mkdir(parents=True, exist_ok=True)
    options = dict(card_options or {})
    files = select_files(folder, include if include is not None else DEFAULT_INCLUDE[kind],
                         DEFAULT_EXCLUDE[kind] + list(exclude or []))  # fmt: skip
    notes: list[str] = []
    try:
        readme = _render_card(kind, folder, repo_id, options)
    except (ValueError, FileNotFoundError, KeyError) as exc:
        raise PublishError(str(exc).strip("'\"")) from None
    if (folder / "README.md").is_file() and kind != "space":
        notes.append(f"{folder / 'README.md'} is replaced by the rendered card")
    for rel in files:
        _place(folder / rel, stage_dir / rel, allow_symlink)
    (stage_dir / "README.md").write_text(readme, encoding="utf-8")
    extra = ["README.md"]
    if kind == "space":
        extra += _stage_kit_for_space(stage_dir, set(files), allow_symlink, notes)
    if kind == "model":
        extra += _stage_model_inputs(folder, stage_dir, options)
    try:
        card = check_readme(readme, kind, where=f"{stage_dir / 'README.md'}")
    except ValueError as exc:
        raise PublishError(str(exc)) from None
    all_files = sorted(f for f in set(files) | set(extra) if (stage_dir / f).is_file())
    size = sum((stage_dir / f).stat().st_size for f in all_files)
    return Staged(stage_dir, all_files, card, card.get("sdk") if kind == "space" else None, size, notes)


def _write_new(path: Path, data: str | bytes) -> None:
    """Write ``path`` as a new file: a hard link placed there from the source folder is removed first,
    so the source is never written through it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.unlink(missing_ok=True)
    if isinstance(data, bytes):
        path.write_bytes(data)
    else:
        path.write_text(data, encoding="utf-8")


def _stage_model_inputs(folder: Path, stage_dir: Path, options: dict[str, Any]) -> list[str]:
    """Stage what the model card was rendered from: the recipes (``recipes/N-TRAINER-NAME.yaml``, secrets
    redacted), ``eval/results.json`` and ``training_summary.json`` (absolute paths of this machine cut to
    their last component; the chosen ``eval_name`` added). Returns the staged relative paths."""

    record = training_record(folder)
    recipes = options.get("recipes") or (record.recipes if record is not None else [])
    staged: list[str] = []
    old = [p for p in (stage_dir / "recipes").glob("*.yaml")] if (stage_dir / "recipes").is_dir() else []
    for path in old:  # recipes of a staged folder being staged again: replaced by the ones rendered
        path.unlink()
    for i, recipe_path in enumerate(recipes, start=1):
        recipe = load_recipe(recipe_path)
        name = Path(recipe_path).name
        rel = f"recipes/{name}" if re.match(r"\d+-(sft|grpo)-", name) else f"recipes/{i}-{recipe.trainer}-{name}"
        _write_new(stage_dir / rel, recipe.text)
        staged.append(rel)
    results = options.get("results") or (folder / "eval" / "results.json" if (folder / "eval" / "results.json").is_file() else None)
    if results:
        _write_new(stage_dir / "eval" / "results.json", Path(results).read_bytes())
        staged.append("eval/results.json")
    if record is not None:
        summary = {k: (Path(v).name if isinstance(v, str) and v.startswith("/") else v) for k, v in record.summary.items()}
        if options.get("eval_name"):
            summary["eval_name"] = options["eval_name"]
        _write_new(stage_dir / "training_summary.json", json.dumps(summary, indent=2, ensure_ascii=False) + "\n")
        staged.append("training_summary.json")
    return staged


# What a Space needs of the kit next to app.py: the library and the task suite (live mode). app.py puts its
# own folder on sys.path.
SPACE_KIT_DIRS = ("reterm", "tasks")


def _stage_kit_for_space(stage_dir: Path, space_files: set[str], allow_symlink: bool, notes: list[str]) -> list[str]:
    """Place the kit's ``reterm/`` and ``tasks/`` in a staged Space (the Hub has no ``reterm``
    package to install). Files the Space folder itself holds win. Returns the staged relative paths."""
    root = Path(__file__).resolve().parent.parent
    staged: list[str] = []
    for name in SPACE_KIT_DIRS:
        src = root / name
        if not src.is_dir():
            notes.append(f"{name}/ not found next to the reterm package: the Space will lack it")
            continue
        for rel in select_files(src, None, ["__pycache__/*", "*.pyc", "*/__pycache__/*"]):
            dest = f"{name}/{rel}"
            if dest not in space_files:
                _place(src / rel, stage_dir / dest, allow_symlink)
                staged.append(dest)
    return staged


def _render_card(kind: str, folder: Path, repo_id: str, options: dict[str, Any]) -> str:
    if kind == "dataset":
        return str(render_dataset_card(folder, repo_id))
    if kind == "model":
        card = render_model_card(
            folder, repo_id, options.get("recipes") or [], options.get("results"),
            eval_name=options.get("eval_name"), base_model=options.get("base_model"),
            datasets=options.get("datasets"), license=options.get("license") or "apache-2.0",
        )  # fmt: skip
        return str(card)
    path = folder / "README.md"
    if not path.is_file():
        raise FileNotFoundError(f"{path}: a Space needs a README.md with its YAML header (sdk, app_file, ...)")
    return path.read_text(encoding="utf-8")


# -------------------------------------------------------------------------------- secret scan
def find_secrets(folder: str | Path, secrets: list[str] | None = None) -> list[str]:
    """Where ``folder`` holds a Hugging Face token: ``["FILE: what"]`` (never the value itself).

    Scans text files (by suffix, up to :data:`MAX_SCAN_BYTES`) and every row of parquet files for
    ``secrets`` (exact values, e.g. the token in use) and :data:`TOKEN_PATTERN`. Follows links.
    """
    folder = Path(folder)
    needles = [s for s in (secrets or []) if s and len(s) >= 8]
    found: list[str] = []

    def check(text: str, where: str) -> None:
        if any(s in text for s in needles):
            found.append(f"{where}: the Hugging Face token in use")
        elif TOKEN_PATTERN.search(text):
            found.append(f"{where}: a string shaped like a Hugging Face token (hf_...)")

    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        rel = path.relative_to(folder).as_posix()
        if path.suffix == ".parquet":
            import pyarrow.parquet as pq

            for i, row in enumerate(pq.read_table(path).to_pylist()):
                text = json.dumps(row, ensure_ascii=False, default=str)
                before = len(found)
                check(text, f"{rel} row {i}")
                if len(found) > before:
                    break
        elif path.suffix.lower() in TEXT_SUFFIXES and path.stat().st_size <= MAX_SCAN_BYTES:
            check(path.read_bytes().decode("utf-8", errors="replace"), rel)
    return found


def machine_roots(*folders: str | Path) -> list[str]:
    """Absolute paths of this machine that must not appear in a published file: the current directory, the
    kit's checkout and each of ``folders`` with its parents (down to two path components: ``/work/run/data``
    gives ``/work/run/data`` and ``/work/run``, so a checkpoint's path beside the dataset is caught too), and
    the home folder when it is not ``/root`` (a sandbox's ``pwd`` legitimately prints ``/root``)."""
    roots: set[Path] = {Path.cwd().resolve(), Path(__file__).resolve().parents[1]}
    for f in folders:
        p = Path(f).expanduser().resolve()
        roots.update(q for q in [p, *p.parents] if len(q.parts) >= 3)
    home = Path.home().resolve()
    if len(home.parts) >= 3:
        roots.add(home)
    return sorted({str(r) for r in roots if len(r.parts) >= 3}, key=len, reverse=True)


def find_machine_paths(folder: str | Path, roots: list[str]) -> list[str]:
    """Where ``folder`` holds an absolute path of this machine (one of ``roots``, :func:`machine_roots`):
    ``["FILE: PATH"]`` (text files by suffix up to :data:`MAX_SCAN_BYTES`, and every parquet row)."""
    folder = Path(folder)
    found: list[str] = []
    patterns = [(r, re.compile(re.escape(r) + r"(?=[/\\\"'\s,;:)\]]|$)")) for r in roots]

    def check(text: str, where: str) -> bool:
        hit = next((r for r, pat in patterns if pat.search(text)), None)
        if hit:
            found.append(f"{where}: {hit}")
        return hit is not None

    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        rel = path.relative_to(folder).as_posix()
        if path.suffix == ".parquet":
            import pyarrow.parquet as pq

            for i, row in enumerate(pq.read_table(path).to_pylist()):
                if check(json.dumps(row, ensure_ascii=False, default=str), f"{rel} row {i}"):
                    break
        elif path.suffix.lower() in TEXT_SUFFIXES and path.stat().st_size <= MAX_SCAN_BYTES:
            check(path.read_bytes().decode("utf-8", errors="replace"), rel)
    return found


# ------------------------------------------------------------------------------------- upload
def upload(
    staged: Staged,
    kind: str,
    repo_id: str,
    *,
    revision: str | None = None,
    private: bool = False,
    delete: list[str] | None = None,
    commit_message: str | None = None,
    commit_description: str | None = None,
    api: Any = None,
) -> str:
    """Create the repo (and branch) if needed and upload the staging folder; returns the commit URL.

    Raises:
        PublishError: no token.
        huggingface_hub.errors.HfHubHTTPError: the Hub refused a request.
    """
    from huggingface_hub import HfApi, get_token

    if get_token() is None:
        raise PublishError("no Hugging Face token: run `hf auth login` or set HF_TOKEN")
    api = api or HfApi()
    url = api.create_repo(repo_id, repo_type=kind, private=private or None, exist_ok=True,
                          space_sdk=staged.space_sdk if kind == "space" else None)  # fmt: skip
    log(f"repo {url}")
    if private:
        info = api.repo_info(repo_id, repo_type=kind)
        if not info.private:
            log(f"warning: {repo_id} already exists and is public; --private applies to new repos only")
    if revision and revision != "main":
        api.create_branch(repo_id, branch=revision, repo_type=kind, exist_ok=True)
        log(f"branch {revision}")
    deletes = DEFAULT_DELETE[kind] + list(delete or [])
    info = api.upload_folder(
        repo_id=repo_id,
        repo_type=kind,
        folder_path=staged.path,
        revision=revision,
        commit_message=commit_message or f"Publish {kind} with `reterm publish`",
        commit_description=commit_description,
        delete_patterns=deletes or None,
    )
    return info.commit_url


# ---------------------------------------------------------------------------------------- CLI
def _parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--repo-id", required=True, help="ORG/NAME on the Hub")
    common.add_argument("--private", action="store_true", help="create the repo private (new repos only)")
    common.add_argument("--revision", help="branch to commit to (created from main if missing), e.g. step-500")
    common.add_argument("--dry-run", action="store_true", help="only write the staging folder and print its path")
    common.add_argument("--stage-dir", type=Path,
                        help="staging folder for --dry-run (default outputs/publish/KIND/ORG--NAME[@REVISION])")  # fmt: skip
    common.add_argument("--include", action="append", metavar="PATTERN",
                        help="only publish files matching (repeatable; replaces the kind's default list)")  # fmt: skip
    common.add_argument("--exclude", action="append", metavar="PATTERN", help="do not publish files matching")
    common.add_argument("--delete", action="append", metavar="PATTERN",
                        help="also delete remote files matching that are not published (repeatable)")  # fmt: skip
    common.add_argument("--commit-message", help="the commit's title")
    common.add_argument("--commit-description", help="the commit's description")

    parser = argparse.ArgumentParser(
        prog="reterm publish",
        description="Publish a dataset, model or Space to the Hugging Face Hub with a rendered card. "
        "Token: HF_TOKEN or `hf auth login`.",
    )
    sub = parser.add_subparsers(dest="kind", required=True)

    def defaults(kind: str) -> str:
        return (
            f"defaults for {kind}: include {DEFAULT_INCLUDE[kind] or 'every file'}; "
            f"exclude {DEFAULT_EXCLUDE[kind] or 'nothing'}; delete remote {DEFAULT_DELETE[kind] or 'nothing'} "
            "when not published. README.md is always the rendered card."
        )

    d = sub.add_parser("dataset", parents=[common], epilog=defaults("dataset"),
                       help="a ReTerm-10K folder (data/*.parquet + stats.json)")  # fmt: skip
    d.add_argument("--folder", type=Path, required=True, help="the pipeline's output folder")
    m = sub.add_parser("model", parents=[common], epilog=defaults("model"),
                       help="a checkpoint (full weights or a LoRA adapter)")  # fmt: skip
    m.add_argument("--folder", type=Path, required=True, help="the checkpoint folder (save_pretrained output)")
    m.add_argument("--recipe", action="append", type=Path,
                   help="TRL recipe YAML of a training stage, in order (repeatable; default: the recipe.yaml "
                   "next to the checkpoint's training_summary.json)")  # fmt: skip
    m.add_argument("--results", type=Path, help="the evaluation's results.json (model-index and results table)")
    m.add_argument("--eval-name", help="this model's name in results.json")
    m.add_argument("--base-model", help="Hub id of the base model (default: from the training outputs/recipe)")
    m.add_argument("--dataset", action="append", help="Hub id of a training dataset (repeatable)")
    m.add_argument("--license", default="apache-2.0", help="Hub licence id (default apache-2.0)")
    s = sub.add_parser("space", parents=[common], epilog=defaults("space").replace(" README.md is always the rendered card.", " README.md is the Space's own."),
                       help="a Gradio Space folder (app.py, README.md, requirements.txt)")  # fmt: skip
    s.add_argument("--folder", type=Path, default=Path("space"), help="the Space folder (default: space)")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``reterm publish``; returns the exit status (0 ok, 1 error, 2 usage)."""
    args = _parser().parse_args(argv)
    kind: str = args.kind
    card_options: dict[str, Any] = {}
    if kind == "model":
        card_options = {"recipes": args.recipe, "results": args.results, "eval_name": args.eval_name,
                        "base_model": args.base_model, "datasets": args.dataset, "license": args.license}  # fmt: skip
    org, name = (args.repo_id.split("/", 1) + [""])[:2]
    tmp: Path | None = None
    if args.dry_run:
        stage_dir = args.stage_dir or Path("outputs/publish") / kind / (f"{org}--{name}" + (f"@{args.revision}" if args.revision else ""))
        if args.stage_dir is None and stage_dir.exists():
            shutil.rmtree(stage_dir)  # our own default location under outputs/publish
    else:
        tmp = Path(tempfile.mkdtemp(prefix="reterm-publish-"))
        stage_dir = tmp / "stage"
    try:
        staged = stage(kind, args.folder, args.repo_id, stage_dir, include=args.include, exclude=args.exclude,
                       allow_symlink=not args.dry_run, card_options=card_options)  # fmt: skip
        for note in staged.notes:
            log(note)
        from huggingface_hub import get_token

        leaks = find_secrets(staged.path, [t for t in [get_token()] if t])
        if leaks:
            raise PublishError("refusing to publish a token:\n" + "\n".join(f"  - {w}" for w in leaks))
        paths = find_machine_paths(staged.path, machine_roots(args.folder))
        if paths:
            raise PublishError("refusing to publish absolute paths of this machine (the card or records would not "
                               "say what they are elsewhere):\n" + "\n".join(f"  - {w}" for w in paths[:20]))
        log(f"staged {len(staged.files)} files, {staged.bytes / 1e6:.2f} MB: " + ", ".join(staged.files[:8])
            + (", ..." if len(staged.files) > 8 else ""))  # fmt: skip
        if args.dry_run:
            print(staged.path.resolve())
            return 0
        url = upload(staged, kind, args.repo_id, revision=args.revision, private=args.private, delete=args.delete,
                     commit_message=args.commit_message, commit_description=args.commit_description)  # fmt: skip
        print(url)
        return 0
    except PublishError as exc:
        print(f"reterm publish: error: {exc}", file=sys.stderr)
        return 1
    except Exception as exc:  # the Hub's answer (HfHubHTTPError...) or a network error: say it plainly
        from huggingface_hub.errors import HfHubHTTPError

        if isinstance(exc, (HfHubHTTPError, OSError, ValueError)):
            print(f"reterm publish: error: {type(exc).__name__}: {exc}", file=sys.stderr)
            return 1
        raise
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)

