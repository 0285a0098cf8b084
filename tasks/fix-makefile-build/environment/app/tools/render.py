"""Tiny Markdown subset to HTML: '# ' headings, '- ' list items, paragraphs."""
import html
import sys


def render(text: str) -> str:
    out, in_list = ["<!doctype html>", "<html><body>"], False
    for line in text.splitlines():
        if line.startswith("- "):
            if not in_list:
                out.append("<ul>")
                in_list = True
            out.append(f"<li>{html.escape(line[2:])}</li>")
            continue
        if in_list:
            out.append("</ul>")
            in_list = False
        if line.startswith("# "):
            out.append(f"<h1>{html.escape(line[2:])}</h1>")
        elif line.strip():
            out.append(f"<p>{html.escape(line)}</p>")
    if in_list:
        out.append("</ul>")
    out.append("</body></html>")
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    with open(sys.argv[1]) as fh:
        sys.stdout.write(render(fh.read()))
