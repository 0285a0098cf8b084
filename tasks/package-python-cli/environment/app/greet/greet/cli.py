"""Command line entry point: greet --name NAME [--shout]."""
import argparse

from . import __version__


def main(argv=None):
    p = argparse.ArgumentParser(prog="greet")
    p.add_argument("--name", default="world")
    p.add_argument("--shout", action="store_true")
    p.add_argument("--version", action="version", version=f"greet {__version__}")
    a = p.parse_args(argv)
    text = f"Hello, {a.name}!"
    print(text.upper() if a.shout else text)
    return 0
