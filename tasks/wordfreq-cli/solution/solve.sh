#!/bin/bash
# A regex over \w without underscore: [^\W_] matches Unicode letters and digits; apostrophes only inside.
cd /app
cat > /app/wordfreq.py <<'PY'
"""Count words in files or standard input (see the task's instruction for the exact rules)."""
import argparse
import collections
import re
import sys

WORD = re.compile(r"[^\W_]+(?:'[^\W_]+)*")


def main(argv=None):
    p = argparse.ArgumentParser(prog="wordfreq")
    p.add_argument("files", nargs="*")
    p.add_argument("-i", "--ignore-case", action="store_true")
    p.add_argument("-n", "--top", type=int, default=None)
    p.add_argument("--min-length", type=int, default=1)
    a = p.parse_args(argv)
    counts = collections.Counter()
    texts = []
    for name in a.files or ["-"]:
        if name == "-":
            texts.append(sys.stdin.read())
            continue
        try:
            with open(name, encoding="utf-8") as fh:
                texts.append(fh.read())
        except OSError as e:
            print(f"wordfreq: {name}: {e.strerror}", file=sys.stderr)
            return 2
    for text in texts:
        for w in WORD.findall(text):
            if a.ignore_case:
                w = w.lower()
            if len(w) >= a.min_length:
                counts[w] += 1
    rows = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    if a.top is not None:
        rows = rows[: a.top]
    sys.stdout.write("".join(f"{n}\t{w}\n" for w, n in rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
PY
python3 /app/wordfreq.py -i -n 3 /app/samples/intro.txt
echo "b a b" | python3 /app/wordfreq.py
