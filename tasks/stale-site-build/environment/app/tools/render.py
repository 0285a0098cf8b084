"""render.py TEMPLATE PAGE.md: fill {{title}} (first line, without '# ') and {{body}} (the rest, as <p>s)."""
import html
import sys

template = open(sys.argv[1]).read()
lines = open(sys.argv[2]).read().splitlines()
title = lines[0].lstrip("# ").strip()
paras = [p.strip() for p in "\n".join(lines[1:]).split("\n\n") if p.strip()]
body = "\n".join(f"<p>{html.escape(p)}</p>" for p in paras)
sys.stdout.write(template.replace("{{title}}", html.escape(title)).replace("{{body}}", body))
