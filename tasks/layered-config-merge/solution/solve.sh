#!/bin/bash
cd /app
cat > /app/merge_config.py <<'PY'
"""Merge JSON config files (later wins, objects recursively, null deletes) and APP__ env overrides."""
import json
import os
import sys


def merge(base, over):
    out = dict(base)
    for key, value in over.items():
        if value is None:
            out.pop(key, None)
        elif isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = value
    return out


def env_value(text):
    try:
        return json.loads(text)
    except ValueError:
        return text


def main(paths):
    config = None
    for path in paths:
        try:
            with open(path) as fh:
                data = json.load(fh)
        except (OSError, ValueError) as e:
            print(f"merge_config: {path}: {e}", file=sys.stderr)
            return 1
        if not isinstance(data, dict):
            print(f"merge_config: {path}: not a JSON object", file=sys.stderr)
            return 1
        config = data if config is None else merge(config, data)
    config = config or {}
    for name in sorted(n for n in os.environ if n.startswith("APP__")):
        keys = name[len("APP__"):].lower().split("__")
        node = config
        for key in keys[:-1]:
            if not isinstance(node.get(key), dict):
                node[key] = {}
            node = node[key]
        node[keys[-1]] = env_value(os.environ[name])
    sys.stdout.write(json.dumps(config, indent=2, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit("usage: merge_config.py FILE [FILE...]")
    sys.exit(main(sys.argv[1:]))
PY
python3 /app/merge_config.py /app/config/base.json /app/config/production.json
APP__SERVICE__PORT=81 APP__DATABASE__OPTIONS__TIMEOUT=10 python3 /app/merge_config.py /app/config/base.json
