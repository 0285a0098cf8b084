"""The Dockerfile reader of the local sandbox (pure parsing; builds are in test_sandbox.py)."""

from __future__ import annotations

import pytest

from reterm.sandbox.build import _ignored, context_files
from reterm.sandbox.dockerfile import DockerfileError, expand, map_base_image, parse, parse_key_values, split_words


def test_parse_continuations_comments_heredocs_and_directives(tmp_path):
    f = tmp_path / "Dockerfile"
    f.write_text(
        "# escape=`\n"
        "FROM debian:12\n"
        "\n"
        "# comment\n"
        "RUN apt-get update && `\n"
        "    # a comment inside a continuation\n"
        "\n"
        "    apt-get install -y jq\n"
        "run <<-EOT\n"
        "\techo tab-stripped\n"
        "\tEOT\n"
        "COPY <<A <<B /dst/\n"
        "a\n"
        "A\n"
        "b\n"
        "B\n"
        'ENTRYPOINT ["x"]\n'
    )
    ins = parse(f)
    assert [i.keyword for i in ins] == ["FROM", "RUN", "RUN", "COPY", "ENTRYPOINT"]
    assert ins[1].args == "apt-get update &&     apt-get install -y jq" and ins[1].line == 5
    assert ins[2].heredocs == [("EOT", "echo tab-stripped\n")] and ins[2].line == 9
    assert ins[3].heredocs == [("A", "a\n"), ("B", "b\n")]
    assert ins[4].json_args() == ["x"] and ins[1].json_args() is None


def test_unterminated_heredoc_names_file_and_line(tmp_path):
    f = tmp_path / "Dockerfile"
    f.write_text("FROM debian:12\nRUN <<EOF\necho x\n")
    with pytest.raises(DockerfileError, match=rf"{f}:2: heredoc <<EOF is not terminated"):
        parse(f)


def test_variable_expansion_and_words():
    v = {"A": "1", "EMPTY": ""}
    assert expand("$A ${A} ${B:-dflt} ${A:+alt} ${EMPTY:-e} \\$A $B.", v) == "1 1 dflt alt e $A ."
    assert split_words('a "b c" \'d e\' f\\ g') == ["a", "b c", "d e", "f g"]
    assert parse_key_values('A=1 B="two words" C=', "x") == {"A": "1", "B": "two words", "C": ""}
    assert parse_key_values("LEGACY some value", "x") == {"LEGACY": "some value"}
    with pytest.raises(DockerfileError, match="x: expected KEY=VALUE"):
        parse_key_values("A=1 oops", "x")


@pytest.mark.parametrize(
    "image,family",
    [
        ("debian:bookworm-slim", "debian"),
        ("buildpack-deps:bookworm", "debian"),
        ("ubuntu:24.04", "ubuntu"),
        ("docker.io/library/ubuntu@sha256:abc", "ubuntu"),
        ("ghcr.io/laude-institute/t-bench/ubuntu-24-04:20250624", "ubuntu"),
        ("ghcr.io/laude-institute/t-bench/python-3-13:20250620", "python"),
        ("python:3.12-slim-bookworm", "python"),
    ],
)
def test_supported_base_images(image, family):
    m = map_base_image(image, "Dockerfile:1")
    assert m.family == family and m.python_aliases == (family == "python")


@pytest.mark.parametrize("image", ["alpine:3.19", "node:20", "nvidia/cuda:12.4.0-base-ubuntu22.04", "scratch",
                                   "rust:1.80", "fedora:40"])  # fmt: skip
def test_other_base_images_are_refused_with_the_reason(image):
    with pytest.raises(DockerfileError, match=r"Dockerfile:3: FROM .*Debian 12 \(bookworm\)"):
        map_base_image(image, "Dockerfile:3")


def test_dockerignore(tmp_path):
    (tmp_path / "keep").mkdir()
    (tmp_path / "keep" / "a.py").write_text("")
    (tmp_path / "keep" / "a.pyc").write_text("")
    (tmp_path / "node_modules" / "x").mkdir(parents=True)
    (tmp_path / "node_modules" / "x" / "y.js").write_text("")
    (tmp_path / "secret.key").write_text("")
    (tmp_path / "important.key").write_text("")
    (tmp_path / ".dockerignore").write_text("# comment\n**/*.pyc\nnode_modules\n*.key\n!important.key\n")
    files = sorted(map(str, context_files(tmp_path)))
    assert files == [".dockerignore", "important.key", "keep/a.py"]
    assert _ignored("node_modules/x/y.js", [(False, "node_modules")])
