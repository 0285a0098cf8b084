"""A tiny, randomly initialised Qwen3.5 for fast tests of the 9B code paths on a CPU.

The real ReTerm policy is Qwen3.5-9B; nothing of that size runs here. Tests and ``--check`` runs of the
9B recipes need a model that takes the *same* code paths: the ``Qwen3_5ForCausalLM`` class (hybrid
linear/full attention), a Qwen-style byte-level BPE tokenizer with the Qwen special tokens, and the
original Qwen3.5 chat template (byte-identical to TRL's ``trl/chat_templates/qwen3_5_think.jinja``), so
TRL recognises it: ``get_training_chat_template`` swaps in ``qwen3_5_think_training.jinja`` (prefix-
preserving, ``{% generation %}`` markers) and ``add_response_schema`` installs the Qwen3.5 tool-call
parser.

Hugging Face hosts such tiny models (``trl-internal-testing/tiny-Qwen3_5ForCausalLM``) but the Hub is not
reachable from every machine this kit runs on, so the model is built offline here: 4 layers (3 linear
attention + 1 full attention, Qwen3.5's pattern), hidden size 64, a byte-level BPE of about 1,300 tokens
trained with ``tokenizers`` on a small built-in corpus of shell and agent text. The weights are random: the
model produces noise, which is all a code-path test needs.

Built once per cache folder, deterministically (fixed seed and corpus), written atomically.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

#: The name a recipe or a policy spec uses for this model.
TINY_QWEN_NAME = "tiny-qwen3.5"
#: Bump when the recipe below changes, so cached copies are rebuilt.
TINY_QWEN_VERSION = 2
#: The chat template file shipped by TRL that the tiny model carries (Qwen3.5-4B and larger, 9B included).
CHAT_TEMPLATE_FILE = "qwen3_5_think.jinja"

# Qwen3.5's added tokens, in Qwen's order. ``special`` = skipped by ``decode(skip_special_tokens=True)``;
# as in Qwen's own tokenizer, the tool-call and thinking tags are added tokens that are *not* special
# (a parser must see them in decoded text).
_ADDED_TOKENS: list[tuple[str, bool]] = [
    ("<|endoftext|>", True),
    ("<|im_start|>", True),
    ("<|im_end|>", True),
    ("<|object_ref_start|>", True),
    ("<|object_ref_end|>", True),
    ("<|box_start|>", True),
    ("<|box_end|>", True),
    ("<|quad_start|>", True),
    ("<|quad_end|>", True),
    ("<|vision_start|>", True),
    ("<|vision_end|>", True),
    ("<|vision_pad|>", True),
    ("<|image_pad|>", True),
    ("<|video_pad|>", True),
    ("<tool_call>", False),
    ("</tool_call>", False),
    ("<|fim_prefix|>", False),
    ("<|fim_middle|>", False),
    ("<|fim_suffix|>", False),
    ("<|fim_pad|>", False),
    ("<|repo_name|>", False),
    ("<|file_sep|>", False),
    ("<tool_response>", False),
    ("</tool_response>", False),
    ("<think>", False),
    ("</think>", False),
]

_BPE_VOCAB_SIZE = 2048
_SEED = 1234

# Qwen2/3/3.5's pre-tokenizer split (transformers' tokenization_qwen3_5.PRETOKENIZE_REGEX).
_PRETOKENIZE_REGEX = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*"""
    r"""|\s*[\r\n]+|\s+(?!\S)|\s+"""
)

_SHELL_CORPUS = """\
ls -la
cd /app && ls
cat README.md
python3 -m pip install requests
pip install numpy pandas
apt-get update && apt-get install -y curl git make gcc
bash: pytest: command not found
ModuleNotFoundError: No module named 'yaml'
Traceback (most recent call last):
  File "/app/main.py", line 3, in <module>
    import yaml
Permission denied
No such file or directory
grep -rn "TODO" src/ | head
sed -i 's/foo/bar/g' config.ini
find . -name '*.py' -exec wc -l {} +
git status && git log --oneline | head -5
make: *** [Makefile:12: build] Error 1
chmod +x run.sh && ./run.sh
echo $? ; exit status 127
python3 -c 'import json, sys; print(json.load(sys.stdin))'
tar -xzf data.tar.gz -C /tmp/data
mkdir -p /app/output && cp results.csv /app/output/
"""


_PROSE_CORPUS = """\
You are an expert Linux engineer working in a terminal. Run one command with the bash tool, read its
output and exit status, then decide the next command. If a command fails, read the error, find its cause
and fix it before moving on. When the task is complete and you have checked the result, call submit.
The file is missing, so I will create the directory first. The package is not installed and there is no
internet access; I will use the standard library instead. The tests pass now.
"""

_TOOLS_CORPUS = (
    '[{"type": "function", "function": {"name": "bash", "description": "Type a command into the terminal.", '
    '"parameters": {"type": "object", "properties": {"command": {"type": "string"}, "timeout": '
    '{"type": "number"}}, "required": ["command"]}}}, {"type": "function", "function": {"name": "submit", '
    '"description": "Declare the task complete.", "parameters": {"type": "object", "properties": {}, '
    '"required": []}}}]'
)


def _cache_root() -> Path:
    return Path(os.environ.get("RETERM_CACHE") or Path.home() / ".cache" / "reterm")


def _corpus() -> list[str]:
    """Text the BPE is trained on: the chat template's fixed text, agent-style prose, tool JSON and shell
    lines. Self-contained (nothing read from the kit's protocol), so the tokenizer, and with it the whole
    model, depends only on this file and TRL's template: the same bytes on every machine."""
    lines = [_chat_template(), _PROSE_CORPUS, _TOOLS_CORPUS] + _SHELL_CORPUS.splitlines()
    # A few repetitions so merges for common words and indentation win over one-off strings.
    return lines * 4


def _chat_template() -> str:
    """TRL's copy of the original Qwen3.5 (thinking) chat template."""
    import trl

    path = Path(trl.__file__).parent / "chat_templates" / CHAT_TEMPLATE_FILE
    if not path.is_file():
        raise FileNotFoundError(f"TRL's Qwen3.5 chat template not found at {path} (trl version changed?)")
    return path.read_text(encoding="utf-8")


def _build_tokenizer():
    """A Qwen-style byte-level BPE (Qwen3.5's pre-tokenizer, NFC normaliser, added tokens) as a
    transformers tokenizer with the Qwen3.5 chat template."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token=None, byte_fallback=False, fuse_unk=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(_PRETOKENIZE_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=_BPE_VOCAB_SIZE,
        min_frequency=2,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=[],
    )
    tok.train_from_iterator(_corpus(), trainer=trainer)
    tok.add_tokens([AddedToken(t, special=s, normalized=False) for t, s in _ADDED_TOKENS])

    hf_tok = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",  # as Qwen3.5's instruct checkpoints
        pad_token="<|endoftext|>",
        unk_token=None,
        bos_token=None,
        clean_up_tokenization_spaces=False,
        model_max_length=262144,
    )
    hf_tok.chat_template = _chat_template()
    return hf_tok


def _build_model(vocab_size: int, pad_token_id: int, eos_token_id: int):
    """A randomly initialised 4-layer, hidden-64 ``Qwen3_5ForCausalLM`` (float32)."""
    import torch
    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

    config = Qwen3_5TextConfig(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=4,  # layer_types default: 3 linear_attention + 1 full_attention
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        linear_key_head_dim=16,
        linear_value_head_dim=16,
        linear_conv_kernel_dim=4,
        max_position_embeddings=4096,
        tie_word_embeddings=False,
        pad_token_id=pad_token_id,
        eos_token_id=eos_token_id,
        bos_token_id=None,
    )
    torch.manual_seed(_SEED)
    model = Qwen3_5ForCausalLM(config).to(torch.float32)
    model.generation_config.eos_token_id = eos_token_id
    model.generation_config.pad_token_id = pad_token_id
    return model


def build_tiny_qwen3_5(output_dir: Path | None = None) -> Path:
    """Build (once) and return the folder of the tiny Qwen3.5 test model.

    Args:
        output_dir: where to save it. Default:
            ``${RETERM_CACHE:-~/.cache/reterm}/models/tiny-qwen3_5-v{TINY_QWEN_VERSION}``.
            If the folder already holds a complete model (``config.json`` and ``tokenizer.json``), it is
            returned as is.

    Returns:
        The folder, loadable with ``AutoTokenizer.from_pretrained`` and
        ``Qwen3_5ForCausalLM.from_pretrained`` (or ``AutoModelForCausalLM``): about 0.33 M parameters,
        float32, a vocabulary of about 1,300 tokens, Qwen3.5's original chat template.

    The build is deterministic (fixed seed and corpus) and atomic: it is written to a temporary sibling
    folder and renamed into place, so concurrent callers and interrupted builds never leave a partial
    model behind.
    """
    if output_dir is None:
        output_dir = _cache_root() / "models" / f"tiny-qwen3_5-v{TINY_QWEN_VERSION}"
    output_dir = Path(output_dir)
    if (output_dir / "config.json").is_file() and (output_dir / "tokenizer.json").is_file():
        return output_dir

    output_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{output_dir.name}.", dir=output_dir.parent))
    tmp.chmod(0o755)  # mkdtemp makes it private; the model is a shared cache entry
    try:
        tokenizer = _build_tokenizer()
        model = _build_model(
            vocab_size=len(tokenizer),
            pad_token_id=tokenizer.pad_token_id,
            eos_token_id=tokenizer.convert_tokens_to_ids("<|im_end|>"),
        )
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        try:
            os.rename(tmp, output_dir)
        except OSError:
            # Another process finished first (or an empty folder was in the way).
            if (output_dir / "config.json").is_file():
                shutil.rmtree(tmp, ignore_errors=True)
            elif output_dir.is_dir() and not any(output_dir.iterdir()):
                output_dir.rmdir()
                os.rename(tmp, output_dir)
            else:
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return output_dir


if __name__ == "__main__":  # python -m reterm.tiny_qwen [DIR]
    import sys

    print(build_tiny_qwen3_5(Path(sys.argv[1]) if len(sys.argv) > 1 else None))
