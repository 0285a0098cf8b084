#!/bin/bash
# pyproject.toml with the setuptools backend (setuptools 66 here supports [project]); package data explicit.
cd /app/greet
cat > /app/greet/pyproject.toml <<'TOML'
[build-system]
requires = ["setuptools>=61"]
build-backend = "setuptools.build_meta"

[project]
name = "greet-cli"
version = "0.3.0"
description = "Friendly greetings"
readme = "README.md"
requires-python = ">=3.9"

[project.scripts]
greet = "greet.cli:main"

[tool.setuptools]
packages = ["greet"]

[tool.setuptools.package-data]
greet = ["phrases.txt"]
TOML
rm -rf /tmp/greet-venv
python3 -m venv --without-pip --system-site-packages /tmp/greet-venv
/tmp/greet-venv/bin/python -m pip install --no-build-isolation --no-index /app/greet
/tmp/greet-venv/bin/greet --name Ada
rm -rf /tmp/greet-venv /app/greet/build /app/greet/greet_cli.egg-info
