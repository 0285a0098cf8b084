"""The drill families: each function takes a ``random.Random`` and returns one :class:`Drill`.

Every family drills one recovery pattern: a natural first mistake that fails with a clear message
(``first_mistake``, whose output contains ``mistake_signal``) and a fix of 1 to 4 commands. The
``premature_completion`` families' mistakes exit 0 with a visibly wrong result (the failure shows when
the task is declared done, as :mod:`reterm.recovery.localise` labels such trajectories). Each family's
category is the label the kit's rule classifier gives its mistake (git's own errors are
``path_permission`` in the taxonomy).

Names, paths, values and the instruction's wording come from the random generator, so one instance's
answer does not solve another. All text is plain ASCII without quotes that a shell would need to
escape; the verifier's expected values are computed here and written into ``tests/test.sh`` (the
agent never sees them)."""

from __future__ import annotations

import base64
import hashlib
import io
import random
import tarfile
import zipfile

from reterm.drills.model import Check, Drill, EnvFile, Family
from reterm.recovery.taxonomy import Category

WORDS = (
    "atlas beacon cobalt delta ember falcon garnet hazel iris juniper kestrel lumen maple nova onyx pebble "
    "quartz raven sable tundra umber vesper willow xenon yarrow zephyr orbit pixel comet lotus cedar birch "
    "coral dune fjord glacier heron ivory jade koala lark meadow"
).split()
NOUNS = "report summary notes index ledger digest inventory status manifest tally roster backlog".split()
TOOLS = "sync export tally stamp pack build collect render audit merge archive publish".split()
DIRS = ("/srv", "/opt", "/root", "/var/local", "/mnt")


def _w(rng: random.Random, n: int = 1, sep: str = "-") -> str:
    return sep.join(rng.sample(WORDS, n))


def _tok(rng: random.Random, n: int = 6) -> str:
    return "".join(rng.choice("abcdefghjkmnpqrstuvwxyz23456789") for _ in range(n))


def _pick(rng: random.Random, templates: list[str], **values: str) -> str:
    return rng.choice(templates).format(**values)


def _content_is(path: str, value: str) -> Check:
    return Check(f'[ "$(cat {path} 2>/dev/null)" = "{value}" ]', f"{path} does not contain exactly: {value}")


# ----------------------------------------------------------------------------- path_permission
def mkdir_parent(rng: random.Random) -> Drill:
    """Write a file under a folder that does not exist yet (fix: ``mkdir -p`` first)."""
    folder = rng.choice(["reports", "exports", "archive", "logs", "backups", "notes", "data", "out"])
    d = f"{rng.choice(DIRS)}/{_w(rng)}/{folder}/{rng.randint(2019, 2031)}"
    path = f"{d}/{rng.choice(NOUNS)}.{rng.choice(['txt', 'log', 'md', 'conf'])}"
    line = f"{_w(rng)} {rng.randint(10, 9999)}"
    instruction = _pick(rng, [
        "Write the line `{line}` into the file `{path}`.",
        "Create the file `{path}` containing exactly one line: `{line}`.",
        "Save the text `{line}` as `{path}` (a single line, nothing else).",
        "Put `{line}` into a new file at `{path}`; the file must hold just that line.",
    ], line=line, path=path)  # fmt: skip
    return Drill(
        family="mkdir-parent", category="path_permission", instruction=instruction, files={},
        checks=[_content_is(path, line)],
        solution=[f"mkdir -p {d}", f"echo '{line}' > {path}"],
        first_mistake=f"echo '{line}' > {path}", mistake_signal="No such file or directory",
        tags=["mkdir", "paths"],
    )  # fmt: skip


def exec_bit(rng: random.Random) -> Drill:
    """Run a script that lacks its execute bit (fix: ``chmod +x`` or ``bash script``)."""
    name = f"{rng.choice(TOOLS)}-{_w(rng)}"
    script = f"{rng.choice(['/opt/tools', '/usr/local/lib/ops', '/srv/scripts', '/root/bin'])}/{name}.sh"
    out = f"{rng.choice(['/srv', '/opt', '/root', '/var/local'])}/{_w(rng)}/{rng.choice(NOUNS)}.txt"
    token = f"{name}-{_tok(rng)}"
    body = (f"#!/bin/bash\n# Writes the {name} stamp.\nmkdir -p $(dirname {out})\n"
            f"echo {token} > {out}\necho \"{name}: wrote {out}\"\n")  # fmt: skip
    instruction = _pick(rng, [
        "Run the script `{script}`; it writes `{out}`.",
        "Execute `{script}` so that it creates `{out}`.",
        "Produce `{out}` by running the script `{script}` (run it as it is; do not edit it).",
    ], script=script, out=out)  # fmt: skip
    return Drill(
        family="exec-bit", category="path_permission", instruction=instruction,
        files={script: EnvFile(body, 0o644)}, checks=[_content_is(out, token)],
        solution=[f"chmod +x {script}", script], first_mistake=script, mistake_signal="Permission denied",
        tags=["chmod", "permissions"], topic="shell-scripting",
    )  # fmt: skip


def cwd_relative(rng: random.Random) -> Drill:
    """Run a program that opens a file relative to its own folder (fix: ``cd`` there first)."""
    app = f"/srv/{_w(rng)}"
    conf = f"{rng.choice(['settings', 'config', 'app', 'job'])}.{rng.choice(['ini', 'cfg', 'conf'])}"
    out = f"/root/{rng.choice(NOUNS)}-{_tok(rng, 4)}.txt"
    token = _tok(rng, 8)
    runner = rng.choice(["run.py", "main.py", "start.py"])
    code = (f"# Reads ./{conf} (relative to the working directory) and writes the output it names.\n"
            f"values = dict(line.strip().split('=', 1) for line in open('{conf}') if '=' in line)\n"
            "with open(values['output'], 'w') as fh:\n    fh.write(values['token'] + '\\n')\n"
            "print('wrote', values['output'])\n")  # fmt: skip
    instruction = _pick(rng, [
        "Run the Python program `{app}/{runner}`; it writes `{out}`.",
        "Produce `{out}` by running `{app}/{runner}` (a Python script) without changing its files.",
        "Use the program in `{app}` (`{runner}`, Python) to create `{out}`.",
    ], app=app, runner=runner, out=out)  # fmt: skip
    return Drill(
        family="cwd-relative", category="path_permission", instruction=instruction,
        files={f"{app}/{runner}": EnvFile(code), f"{app}/{conf}": EnvFile(f"output={out}\ntoken={token}\n")},
        checks=[_content_is(out, token)],
        solution=[f"cd {app}", f"python3 {runner}"], first_mistake=f"python3 {app}/{runner}",
        mistake_signal=f"No such file or directory: '{conf}'", tags=["working-directory", "python"],
        topic="software-engineering",
    )  # fmt: skip


def git_identity(rng: random.Random) -> Drill:
    """Commit in a repository on a machine without a git identity (fix: ``git -c user.name=.. -c user.email=..``).

    Git's own errors are ``path_permission`` in :mod:`reterm.recovery.taxonomy`."""
    repo = f"{rng.choice(['/srv', '/root', '/opt'])}/{_w(rng)}"
    fname = f"{rng.choice(NOUNS)}.{rng.choice(['md', 'txt', 'cfg'])}"
    msg = f"{rng.choice(['Add', 'Record', 'Track'])} {fname.split('.')[0]} {_tok(rng, 4)}"
    first = rng.choice(["Ada", "Bo", "Cy", "Dana", "Eli", "Fay", "Gus", "Ivy", "Jo", "Kim"])
    who = f"{first} {rng.choice(['Lund', 'Moss', 'Nash', 'Ortiz', 'Park', 'Quinn', 'Reyes', 'Stone'])}"
    email = f"{first.lower()}@{rng.choice(WORDS)}.example"
    instruction = _pick(rng, [
        "In the git repository `{repo}`, commit the file `{fname}` with the message `{msg}`, as {who} <{email}>.",
        "Commit `{repo}/{fname}` (author {who}, {email}) with the commit message `{msg}`.",
        "Record the new file `{fname}` of the repository `{repo}` in a commit with message `{msg}`; the author is "
        "{who} <{email}>.",
    ], repo=repo, fname=fname, msg=msg, who=who, email=email)  # fmt: skip
    g = f"git -C {repo}"
    return Drill(
        family="git-identity", category="path_permission", instruction=instruction,
        files={f"{repo}/{fname}": EnvFile(f"{_w(rng, 3, ' ')}\n")},
        run=[f"git init -q {repo} && git -C {repo} -c user.name=Setup -c user.email=setup@example.invalid "
             "commit -q --allow-empty -m 'Initial commit'"],
        checks=[Check(f'[ "$({g} log -1 --format=%s 2>/dev/null)" = "{msg}" ]', f"the last commit's message is not {msg}"),
                Check(f'[ "$({g} log -1 --format=%ae 2>/dev/null)" = "{email}" ]', f"the last commit's author is not {email}"),
                Check(f"{g} cat-file -e HEAD:{fname} 2>/dev/null", f"{fname} is not in the last commit")],
        solution=[f"cd {repo}", f"git add {fname}",
                  f"git -c user.name='{who}' -c user.email={email} commit -m '{msg}'"],
        first_mistake=f"cd {repo} && git add {fname} && git commit -m '{msg}'",
        mistake_signal="identity unknown", tags=["git"], topic="version-control",
    )  # fmt: skip


# -------------------------------------------------------------------------- missing_dependency
def _wheel(dist: str, version: str, files: dict[str, str]) -> bytes:
    """A minimal pure-Python wheel (PEP 427) with a fixed timestamp, so the same input gives the same bytes."""
    info = f"{dist}-{version}.dist-info"
    entries = dict(files)
    entries[f"{info}/METADATA"] = f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n"
    entries[f"{info}/WHEEL"] = "Wheel-Version: 1.0\nGenerator: reterm-drills\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    record = []
    for name, text in entries.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
        record.append(f"{name},sha256={digest},{len(text.encode())}")
    entries[f"{info}/RECORD"] = "\n".join(record + [f"{info}/RECORD,,"]) + "\n"
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, text in entries.items():
            zi = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))
            zi.external_attr = 0o644 << 16
            zi.compress_type = zipfile.ZIP_DEFLATED
            zf.writestr(zi, text)
    return buf.getvalue()


def _helper_module(rng: random.Random) -> tuple[str, str, str, int, str]:
    """A helper module: (module name, function name, source, argument, expected result)."""
    mod = f"{rng.choice(WORDS)}{rng.choice(['kit', 'lib', 'utils', 'fmt', 'core'])}"
    fn = rng.choice(["render", "label", "stamp", "encode", "tag"])
    k, arg, prefix = rng.randint(2, 9), rng.randint(3, 999), rng.choice(WORDS)
    src = f"def {fn}(n):\n    return '{prefix}-' + str(n * {k})\n"
    return mod, fn, src, arg, f"{prefix}-{arg * k}"


def _script_using(mod: str, fn: str, arg: int, out: str) -> str:
    return (f"from {mod} import {fn}\n\nwith open('{out}', 'w') as fh:\n    fh.write({fn}({arg}) + '\\n')\n"
            f"print('wrote {out}')\n")  # fmt: skip


def local_wheel(rng: random.Random) -> Drill:
    """A script needs a package that is only in a local wheel folder (fix: pip install --no-index --find-links)."""
    mod, fn, src, arg, want = _helper_module(rng)
    wheels = rng.choice(["/opt/wheels", "/srv/wheelhouse", "/opt/pkgs", "/var/local/wheels"])
    version = f"{rng.randint(0, 3)}.{rng.randint(0, 12)}.{rng.randint(0, 9)}"
    script = f"/app/{rng.choice(TOOLS)}_{rng.choice(NOUNS)}.py"
    out = f"/app/{rng.choice(NOUNS)}-{_tok(rng, 4)}.txt"
    instruction = _pick(rng, [
        "Run `python3 {script}` so that it writes `{out}`. The machine is offline; the Python packages it "
        "needs are wheels in `{wheels}`.",
        "Make `{script}` (Python) run and write `{out}`. There is no network; install what it needs from the "
        "wheel folder `{wheels}`.",
        "Produce `{out}` with the script `{script}`. Packages can only come from the local wheels in `{wheels}`.",
    ], script=script, out=out, wheels=wheels)  # fmt: skip
    return Drill(
        family="local-wheel", category="missing_dependency", instruction=instruction,
        files={script: EnvFile(_script_using(mod, fn, arg, out)),
               f"{wheels}/{mod}-{version}-py3-none-any.whl": EnvFile(_wheel(mod, version, {f"{mod}/__init__.py": src}))},
        run=["rm -f /usr/lib/python3*/EXTERNALLY-MANAGED"],
        checks=[_content_is(out, want), Check(f"python3 -c 'import {mod}' 2>/dev/null", f"package {mod} is not installed")],
        solution=[f"pip install --no-index --find-links {wheels} {mod}", f"python3 {script}"],
        first_mistake=f"python3 {script}", mistake_signal=f"No module named '{mod}'",
        tags=["pip", "offline", "python"], topic="software-engineering",
    )  # fmt: skip


def pythonpath_module(rng: random.Random) -> Drill:
    """A script imports a module from a folder that is not on Python's path (fix: ``PYTHONPATH=``)."""
    mod, fn, src, arg, want = _helper_module(rng)
    libdir = f"{rng.choice(['/opt', '/srv', '/usr/local/share'])}/{_w(rng)}/lib"
    script = f"/app/{rng.choice(TOOLS)}_{rng.choice(NOUNS)}.py"
    out = f"/app/out/{rng.choice(NOUNS)}-{_tok(rng, 4)}.txt"
    instruction = _pick(rng, [
        "Run `python3 {script}` so that it writes `{out}`. Its helper module `{mod}` is in `{libdir}`; "
        "do not move or copy any file.",
        "Make `{script}` write `{out}`. It imports `{mod}`, which lives in `{libdir}` (leave the files where they are).",
        "Produce `{out}` by running the Python script `{script}`; the module `{mod}` it needs is in `{libdir}` "
        "(do not copy it).",
    ], script=script, out=out, mod=mod, libdir=libdir)  # fmt: skip
    return Drill(
        family="pythonpath-module", category="missing_dependency", instruction=instruction,
        files={script: EnvFile(_script_using(mod, fn, arg, out)), f"{libdir}/{mod}.py": EnvFile(src),
               "/app/out/.keep": EnvFile("")},
        checks=[_content_is(out, want), Check(f"[ ! -e /app/{mod}.py ]", f"/app/{mod}.py was copied next to the script")],
        solution=[f"PYTHONPATH={libdir} python3 {script}"],
        first_mistake=f"python3 {script}", mistake_signal=f"No module named '{mod}'",
        tags=["python", "imports"], topic="software-engineering",
    )  # fmt: skip


def python_alias(rng: random.Random) -> Drill:
    """Run a Python script with ``python``, which this system does not have (fix: ``python3``)."""
    n, word = rng.randint(3, 40), rng.choice(WORDS)
    folder = rng.choice(["/app", "/srv/jobs", "/opt/scripts"])
    script = f"{folder}/{rng.choice(['make', 'gen', 'write', 'build'])}_{rng.choice(NOUNS)}.py"
    out = f"{folder}/{rng.choice(NOUNS)}-{_tok(rng, 4)}.txt"
    code = f"with open('{out}', 'w') as fh:\n    fh.write('{word} ' * {n} + '\\n')\nprint('wrote {out}')\n"
    instruction = _pick(rng, [
        "Create `{out}` by running the Python script `{script}` with `python`.",
        "Run `python {script}`; it writes `{out}`.",
        "Use `python` to run `{script}`, which produces `{out}`.",
    ], out=out, script=script)  # fmt: skip
    return Drill(
        family="python-alias", category="missing_dependency", instruction=instruction,
        files={script: EnvFile(code)},
        checks=[Check(f'[ "$(cat {out} 2>/dev/null)" = "{(word + " ") * n}" ]', f"{out} is missing or wrong")],
        solution=[f"python3 {script}"], first_mistake=f"python {script}", mistake_signal="python: command not found",
        tags=["python"], topic="software-engineering",
    )  # fmt: skip


# ------------------------------------------------------------------------------ wrong_command
def _tar(members: dict[str, tuple[str, int]], top: str | None, compression: str) -> bytes:
    """A tar archive (``gz``, ``bz2`` or ``xz``) of the given files (relative path -> (text, mode)), under the
    folder ``top`` when given; fixed mtimes, so the same input gives the same bytes."""
    import bz2
    import gzip
    import lzma

    raw = io.BytesIO()
    prefix = f"{top}/" if top else ""
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.GNU_FORMAT) as tf:
        dirs = sorted({"/".join(p.split("/")[:i]) for p in members for i in range(1, p.count("/") + 1)})
        for d in ([""] if top else []) + dirs:
            ti = tarfile.TarInfo(f"{prefix}{d}".rstrip("/"))
            ti.type, ti.mode, ti.mtime = tarfile.DIRTYPE, 0o755, 1700000000
            tf.addfile(ti)
        for path, (text, mode) in sorted(members.items()):
            data = text.encode()
            ti = tarfile.TarInfo(f"{prefix}{path}")
            ti.size, ti.mode, ti.mtime = len(data), mode, 1700000000
            tf.addfile(ti, io.BytesIO(data))
    data = raw.getvalue()
    if compression == "gz":
        return gzip.compress(data, mtime=0)
    if compression == "bz2":
        return bz2.compress(data)
    return lzma.compress(data, format=lzma.FORMAT_XZ)


def _zip(members: dict[str, tuple[str, int]]) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, (text, mode) in sorted(members.items()):
            zi = zipfile.ZipInfo(name, date_time=(2024, 1, 1, 0, 0, 0))
            zi.external_attr = mode << 16
            zi.compress_type = zipfile.ZIP_DEFLATED
            zf.writestr(zi, text)
    return buf.getvalue()


def tar_format(rng: random.Random) -> Drill:
    """Unpack an archive with the wrong tool or flag: ``tar -xzf`` on an xz or bzip2 tarball, ``tar`` on a
    zip file (fix: ``tar -xf``, which detects the compression, or ``unzip``)."""
    name = rng.choice(WORDS)
    kind = rng.choice(["xz", "bz2", "zip"])
    ext = {"xz": "tar.xz", "bz2": "tar.bz2", "zip": "zip"}[kind]
    archive = f"{rng.choice(['/data', '/srv/incoming', '/opt/downloads'])}/{name}-{rng.choice(NOUNS)}.{ext}"
    dest = f"{rng.choice(['/srv', '/opt', '/root'])}/{name}-{_tok(rng, 4)}"
    members = {f"{rng.choice(NOUNS)}.txt": (f"{_w(rng)} {rng.randint(1, 9999)}\n", 0o644),
               f"conf/{rng.choice(['main', 'site', 'app'])}.ini": (f"key={_tok(rng)}\n", 0o644)}
    data = _zip(members) if kind == "zip" else _tar(members, None, kind)
    instruction = _pick(rng, [
        "Unpack the archive `{archive}` into `{dest}` (create the folder).",
        "Extract everything in `{archive}` into the new folder `{dest}`.",
        "Put the contents of `{archive}` into `{dest}`; the folder does not exist yet.",
    ], archive=archive, dest=dest)  # fmt: skip
    fix = f"unzip -q {archive} -d {dest}" if kind == "zip" else f"tar -xf {archive} -C {dest}"
    if kind == "zip":  # tar on a zip file (gzip would unpack a one-file zip, so not tar -xzf)
        mistake, signal = f"mkdir -p {dest} && tar -xf {archive} -C {dest}", "This does not look like a tar archive"
    else:  # the habitual -z on an xz or bzip2 tarball
        mistake, signal = f"mkdir -p {dest} && tar -xzf {archive} -C {dest}", "not in gzip format"
    return Drill(
        family="tar-format", category="wrong_command", instruction=instruction, files={archive: EnvFile(data)},
        checks=[_content_is(f"{dest}/{p}", t.strip()) for p, (t, _) in members.items()],
        solution=[f"mkdir -p {dest}", fix], first_mistake=mistake, mistake_signal=signal,
        tags=["tar", "archives", kind],
    )  # fmt: skip


def copy_dir(rng: random.Random) -> Drill:
    """Copy a folder with plain ``cp`` (fix: ``cp -r``)."""
    src = f"{rng.choice(['/srv', '/opt', '/data'])}/{_w(rng)}"
    dst = f"{rng.choice(['/backup', '/root/copies', '/var/backups'])}/{src.rsplit('/', 1)[1]}-{_tok(rng, 4)}"
    files = {f"{src}/{rng.choice(NOUNS)}.txt": EnvFile(f"{_w(rng)} {rng.randint(1, 999)}\n"),
             f"{src}/conf/{rng.choice(['main', 'site', 'local'])}.conf": EnvFile(f"key={_tok(rng)}\n")}
    checks = [_content_is(dst + p[len(src):], f.data.decode().strip()) for p, f in files.items()]
    instruction = _pick(rng, [
        "Make a copy of the folder `{src}`, with everything in it, at `{dst}`.",
        "Copy the directory `{src}` to `{dst}` (the copy must contain all its files and subfolders).",
        "Back up `{src}` by copying the whole folder to `{dst}`.",
    ], src=src, dst=dst)  # fmt: skip
    return Drill(
        family="copy-dir", category="wrong_command", instruction=instruction, files=files,
        run=[f"mkdir -p {dst.rsplit('/', 1)[0]}"], checks=checks,
        solution=[f"cp -r {src} {dst}"], first_mistake=f"cp {src} {dst}", mistake_signal="-r not specified",
        tags=["cp", "files"],
    )  # fmt: skip


# ---------------------------------------------------------------------- faulty_implementation
_BUGS = [
    # (function template, buggy line, fixed line, python expression of the right answer for argument n)
    ("def {fn}(n):\n    \"\"\"Sum of 1..n (inclusive).\"\"\"\n    total = 0\n{line}\n        total += i\n    return total\n",
     "    for i in range(1, n):", "    for i in range(1, n + 1):", "n * (n + 1) // 2"),
    ("def {fn}(n):\n    \"\"\"How many whole numbers lie between 1 and n, both included.\"\"\"\n{line}\n",
     "    return n - 1", "    return n", "n"),
    ("def {fn}(n):\n    \"\"\"The first n squares: [1, 4, 9, ...] (n items).\"\"\"\n{line}\n",
     "    return [i * i for i in range(1, n)]", "    return [i * i for i in range(1, n + 1)]",
     "[i * i for i in range(1, n + 1)]"),
    ("def {fn}(n):\n    \"\"\"The last n letters of the alphabet.\"\"\"\n    letters = 'abcdefghijklmnopqrstuvwxyz'\n{line}\n",
     "    return letters[-n + 1:]", "    return letters[-n:]", "'abcdefghijklmnopqrstuvwxyz'[-n:]"),
]


def off_by_one(rng: random.Random) -> Drill:
    """A one-line off-by-one in a Python module that a check script catches (fix: ``sed -i`` on that line)."""
    template, bad, good, answer = rng.choice(_BUGS)
    fn = f"{rng.choice(['count', 'compute', 'make', 'get'])}_{rng.choice(['items', 'values', 'range', 'block', 'span'])}"
    mod = f"{rng.choice(WORDS)}_{rng.choice(['math', 'calc', 'util', 'ops'])}"
    probe = rng.randint(3, 9)
    hidden = sorted({rng.randint(2, 20) for _ in range(3)} | {probe})
    src = template.format(fn=fn, line=bad)
    check = (f"from {mod} import {fn}\n\nn = {probe}\nwant = {answer}\ngot = {fn}(n)\n"
             f"if got != want:\n    raise SystemExit(f'FAIL: {fn}({{n}}) returned {{got!r}}, expected {{want!r}}')\n"
             "print('OK')\n")  # fmt: skip
    check_path = f"/app/check_{mod}.py"
    check_sha = hashlib.sha256(check.encode()).hexdigest()
    hidden_py = (f"import sys\nsys.path.insert(0, '/app')\nfrom {mod} import {fn}\n"
                 f"for n in {hidden}:\n    assert {fn}(n) == {answer}, n\n")  # fmt: skip
    instruction = _pick(rng, [
        "`python3 {check}` fails: `{fn}` in `/app/{mod}.py` has an off-by-one bug in one line. Fix that line so "
        "the check passes (do not edit the check).",
        "Fix the off-by-one error in `{fn}` of `/app/{mod}.py` (a single line) so that `python3 {check}` prints "
        "OK. Leave the check file as it is.",
        "One line of `/app/{mod}.py` is off by one, so `python3 {check}` fails on `{fn}`. Correct that line "
        "without touching the check.",
    ], check=check_path, mod=mod, fn=fn)  # fmt: skip
    sed = f"sed -i 's/^{_sed_pattern(bad)}$/{_sed_replacement(good)}/' /app/{mod}.py"
    return Drill(
        family="off-by-one", category="faulty_implementation", instruction=instruction,
        files={f"/app/{mod}.py": EnvFile(src), check_path: EnvFile(check)},
        checks=[Check(f'[ "$(sha256sum {check_path} | cut -d" " -f1)" = "{check_sha}" ]', f"{check_path} was changed"),
                Check("timeout 10 python3 /tests/hidden_check.py", f"{fn} still gives wrong results")],
        test_files={"hidden_check.py": hidden_py},
        solution=[sed, f"python3 {check_path}"],
        first_mistake=f"python3 {check_path}", mistake_signal=f"FAIL: {fn}(",
        tags=["python", "bugfix", "sed"], topic="software-engineering",
    )  # fmt: skip


def _sed_pattern(text: str) -> str:
    """``text`` as a literal sed basic regular expression."""
    return "".join("\\" + ch if ch in "\\[.*^$/" else ch for ch in text)


def _sed_replacement(text: str) -> str:
    """``text`` as a literal sed replacement."""
    return "".join("\\" + ch if ch in "\\&/" else ch for ch in text)


# -------------------------------------------------------------------------------- wrong_state
def env_var(rng: random.Random) -> Drill:
    """A program needs an environment variable that is not set; its error names it (fix: ``VAR=value cmd``)."""
    tool = f"{rng.choice(TOOLS)}_{rng.choice(NOUNS)}"
    var = f"{tool.split('_')[0].upper()}_{rng.choice(['DIR', 'OUT', 'TARGET', 'DEST'])}"
    target = f"{rng.choice(['/srv', '/root', '/var/local'])}/{_w(rng)}"
    fname, token = f"{rng.choice(NOUNS)}.txt", _tok(rng, 8)
    code = (f"import os\nimport sys\n\ntarget = os.environ.get('{var}')\nif not target:\n"
            f"    sys.exit('{tool}: error: output folder not configured: {var} is not set (the folder to write {fname} into)')\n"
            f"os.makedirs(target, exist_ok=True)\nwith open(os.path.join(target, '{fname}'), 'w') as fh:\n"
            f"    fh.write('{token}\\n')\nprint('{tool}: wrote', os.path.join(target, '{fname}'))\n")  # fmt: skip
    instruction = _pick(rng, [
        "Run `python3 /app/{tool}.py` so that it writes its output file into the folder `{target}`.",
        "Use `/app/{tool}.py` (Python) to write its {fname} into `{target}`.",
        "Make `/app/{tool}.py` put its output into `{target}` (run it with python3).",
    ], tool=tool, target=target, fname=fname)  # fmt: skip
    return Drill(
        family="env-var", category="wrong_state", instruction=instruction, files={f"/app/{tool}.py": EnvFile(code)},
        checks=[_content_is(f"{target}/{fname}", token)],
        solution=[f"{var}={target} python3 /app/{tool}.py"], first_mistake=f"python3 /app/{tool}.py",
        mistake_signal=f"{var} is not set", tags=["environment-variables", "python"], topic="software-engineering",
    )  # fmt: skip


def sqlite_schema(rng: random.Random) -> Drill:
    """Load rows into a new SQLite database before its tables exist (fix: load the schema first)."""
    table = rng.choice(["items", "orders", "readings", "tickets", "visits", "parts"])
    col = rng.choice(["qty", "amount", "score", "minutes", "weight"])
    base = f"{rng.choice(['/data', '/srv/import'])}/{rng.choice(WORDS)}"
    db = f"{rng.choice(['/app', '/srv/db', '/root'])}/{rng.choice(WORDS)}.db"
    rows = [(i, _w(rng), rng.randint(1, 500)) for i in range(1, rng.randint(5, 14))]
    schema = f"CREATE TABLE {table} (id INTEGER PRIMARY KEY, name TEXT NOT NULL, {col} INTEGER NOT NULL);\n"
    inserts = "".join(f"INSERT INTO {table} VALUES ({i}, '{n}', {v});\n" for i, n, v in rows)
    instruction = _pick(rng, [
        "Load the rows in `{base}_rows.sql` into the SQLite database `{db}`. The database is new; its table "
        "definitions are in `{base}_schema.sql`.",
        "Import `{base}_rows.sql` into a new SQLite database at `{db}` (the tables are defined in "
        "`{base}_schema.sql`).",
        "Create the SQLite database `{db}` holding the data of `{base}_rows.sql`; the schema is in `{base}_schema.sql`.",
    ], base=base, db=db)  # fmt: skip
    want = f"{len(rows)}|{sum(v for _, _, v in rows)}"
    return Drill(
        family="sqlite-schema", category="wrong_state", instruction=instruction,
        files={f"{base}_schema.sql": EnvFile(schema), f"{base}_rows.sql": EnvFile(inserts),
               "/app/.keep": EnvFile(""), "/srv/db/.keep": EnvFile("")},
        checks=[Check(f'[ "$(sqlite3 {db} "SELECT COUNT(*), SUM({col}) FROM {table}" 2>/dev/null)" = "{want}" ]',
                      f"{db} does not hold the {len(rows)} rows of {table}")],
        solution=[f"sqlite3 {db} < {base}_schema.sql", f"sqlite3 {db} < {base}_rows.sql"],
        first_mistake=f"sqlite3 {db} < {base}_rows.sql", mistake_signal=f"no such table: {table}",
        tags=["sqlite", "sql"], topic="data-processing",
    )  # fmt: skip


def stale_lock(rng: random.Random) -> Drill:
    """A job refuses to start because of a lock file left by a run that is gone (fix: remove the lock)."""
    job = f"{rng.choice(['nightly', 'hourly', 'rotate', 'cleanup', 'backup'])}-{rng.choice(WORDS)}"
    lock = f"{rng.choice(['/var/tmp', '/srv/locks', '/var/lib/jobs', '/opt/run'])}/{job}.{rng.choice(['pid', 'lock'])}"
    out = f"/srv/{job}/{rng.choice(NOUNS)}.txt"
    token = _tok(rng, 8)
    body = (f"#!/bin/bash\nlock={lock}\nif [ -e \"$lock\" ]; then\n"
            f"  echo \"{job}: pid file $lock exists (pid $(cat $lock)); remove it if no other {job} run is active\" >&2\n"
            f"  exit 1\nfi\necho $$ > \"$lock\"\nmkdir -p /srv/{job}\necho {token} > {out}\nrm -f \"$lock\"\n"
            f"echo \"{job}: done\"\n")  # fmt: skip
    instruction = _pick(rng, [
        "Run the job `/app/{job}.sh`; it writes `{out}`. No other run of this job is active.",
        "Execute `/app/{job}.sh` so that `{out}` gets written. Nothing else is running this job right now.",
        "Get `{out}` written by running the job script `/app/{job}.sh` (no other run of it is active).",
    ], job=job, out=out)  # fmt: skip
    return Drill(
        family="stale-lock", category="wrong_state", instruction=instruction,
        files={f"/app/{job}.sh": EnvFile(body, 0o755), lock: EnvFile(f"{rng.randint(2000, 60000)}\n")},
        checks=[_content_is(out, token)],
        solution=[f"rm -f {lock}", f"/app/{job}.sh"], first_mistake=f"/app/{job}.sh", mistake_signal="remove it",
        tags=["locks", "jobs"], topic="shell-scripting",
    )  # fmt: skip


# ------------------------------------------------------------------------------- timeout_hang
def follow_flag(rng: random.Random) -> Drill:
    """A tool follows its input forever unless given a flag (fix: the flag its message names)."""
    tool = f"{rng.choice(['logcount', 'tallylog', 'scanlog', 'levelstat'])}"
    flag = rng.choice(["--once", "--no-follow", "--batch", "--no-watch"])
    level = rng.choice(["ERROR", "WARN", "FATAL", "DENIED"])
    log = f"/var/log/{rng.choice(WORDS)}.log"
    out = f"/root/{level.lower()}-count-{_tok(rng, 4)}.txt"
    lines = [f"2026-11-{rng.randint(1, 28):02d} {rng.choice(['INFO', 'DEBUG', level])} {_w(rng, 2, ' ')}"
             for _ in range(rng.randint(12, 40))]  # fmt: skip
    count = sum(1 for line in lines if f" {level} " in line)
    attr = flag[2:].replace("-", "_")
    code = (f"import argparse\nimport time\n\np = argparse.ArgumentParser(description='Count {level} lines of a log.')\n"
            "p.add_argument('log')\np.add_argument('out')\n"
            f"p.add_argument('{flag}', action='store_true', help='stop at the end of the file instead of following it')\n"
            f"a = p.parse_args()\nlines = open(a.log).read().splitlines()\nn = sum(1 for x in lines if ' {level} ' in x)\n"
            f"if not a.{attr}:\n"
            f"    print(f'{tool}: {{len(lines)}} lines read; following {{a.log}} for new lines (use {flag} to stop at "
            "the end of the file)', flush=True)\n    while True:\n        time.sleep(1)\n"
            f"with open(a.out, 'w') as fh:\n    fh.write(str(n) + '\\n')\n")  # fmt: skip
    instruction = _pick(rng, [
        "Count the {level} lines of `{log}` into `{out}` with `python3 /app/{tool}.py {log} {out}`.",
        "Use the tool `/app/{tool}.py` (arguments: LOG OUT) to write the number of {level} lines in `{log}` to `{out}`.",
        "Write how many {level} lines `{log}` has into `{out}`, using `/app/{tool}.py LOG OUT` (Python).",
    ], level=level, log=log, out=out, tool=tool)  # fmt: skip
    return Drill(
        family="follow-flag", category="timeout_hang", instruction=instruction,
        files={f"/app/{tool}.py": EnvFile(code), log: EnvFile("\n".join(lines) + "\n")},
        checks=[_content_is(out, str(count))],
        solution=[f"python3 /app/{tool}.py {flag} {log} {out}"],
        first_mistake=f"python3 /app/{tool}.py {log} {out}", mistake_signal=f"use {flag}", mistake_timeout_s=4.0,
        tags=["hang", "flags", "logs"], topic="data-processing",
    )  # fmt: skip


# ------------------------------------------------------------------------ premature_completion
def strip_components(rng: random.Random) -> Drill:
    """Unpack an archive whose files sit under a top-level folder into a target (fix: ``--strip-components=1``)."""
    name = rng.choice(WORDS)
    ver = f"{rng.randint(0, 5)}.{rng.randint(0, 20)}.{rng.randint(0, 9)}"
    top = f"{name}-{ver}"
    archive = f"{rng.choice(['/data', '/srv/dist', '/opt/downloads'])}/{top}.tar.gz"
    dest = f"{rng.choice(['/opt', '/srv', '/usr/local/apps'])}/{name}"
    conf = f"{rng.choice(['port', 'workers', 'level'])}={rng.randint(1, 9000)}"
    members = {f"bin/{name}": (f"#!/bin/sh\necho {name} {ver}\n", 0o755),
               f"etc/{name}.conf": (conf + "\n", 0o644), "README": (f"{name} {ver}\n", 0o644)}
    instruction = _pick(rng, [
        "Unpack `{archive}` into `{dest}` so that the files land directly in it: `{dest}/bin/{name}` must "
        "exist, with no `{top}` folder in between.",
        "Install the release `{archive}` into `{dest}`: the result must be `{dest}/bin/{name}` and "
        "`{dest}/etc/{name}.conf` (not `{dest}/{top}/...`).",
        "Extract `{archive}` into the existing folder `{dest}`, dropping the archive's top-level folder "
        "(`{dest}/bin/{name}`, not `{dest}/{top}/bin/{name}`).",
    ], archive=archive, dest=dest, name=name, top=top)  # fmt: skip
    return Drill(
        family="strip-components", category="premature_completion", instruction=instruction,
        files={archive: EnvFile(_tar(members, top, "gz"))}, run=[f"mkdir -p {dest}"],
        checks=[Check(f'[ -x {dest}/bin/{name} ] && [ "$({dest}/bin/{name})" = "{name} {ver}" ]',
                      f"{dest}/bin/{name} is missing, not executable or wrong"),
                _content_is(f"{dest}/etc/{name}.conf", conf),
                Check(f"[ ! -e {dest}/{top} ]", f"{dest}/{top} exists (the top-level folder was not dropped)")],
        solution=[f"tar -xzf {archive} -C {dest} --strip-components=1"],
        recovery=[f"rm -rf {dest}/{top}", f"tar -xzf {archive} -C {dest} --strip-components=1"],
        first_mistake=f"tar -xzvf {archive} -C {dest}", mistake_signal=f"{top}/bin/{name}",
        tags=["tar", "archives"],
    )  # fmt: skip


def sort_numeric(rng: random.Random) -> Drill:
    """Sort numbers with plain ``sort``, which orders them as text (fix: ``sort -n``)."""
    nums = rng.sample(range(1, 10), 3) + rng.sample(range(10, 100), 3) + rng.sample(range(100, 20000), rng.randint(4, 9))
    nums.append(rng.choice([10, 100, 1000]) + rng.randint(0, 9))
    nums = list(dict.fromkeys(nums))
    rng.shuffle(nums)
    src = f"{rng.choice(['/data', '/srv/stats', '/root'])}/{rng.choice(['sizes', 'counts', 'scores', 'durations'])}.txt"
    out = f"{rng.choice(['/app', '/root', '/srv/out'])}/{rng.choice(['sorted', 'ordered', 'ranked'])}-{_tok(rng, 4)}.txt"
    want = "\n".join(str(n) for n in sorted(nums))
    instruction = _pick(rng, [
        "Sort the numbers in `{src}` from smallest to largest (numeric order) and write them to `{out}`, one per line.",
        "Write the numbers of `{src}` to `{out}` in ascending numeric order, one per line.",
        "`{src}` holds one number per line. Put them into `{out}` sorted by value, smallest first.",
    ], src=src, out=out)  # fmt: skip
    return Drill(
        family="sort-numeric", category="premature_completion", instruction=instruction,
        files={src: EnvFile("\n".join(map(str, nums)) + "\n"), "/app/.keep": EnvFile(""), "/srv/out/.keep": EnvFile("")},
        checks=[Check(f"diff -q {out} - >/dev/null 2>&1 <<'EXPECTED'\n{want}\nEXPECTED", f"{out} is not in numeric order")],
        solution=[f"sort -n {src} > {out}"],
        first_mistake=f"sort {src} > {out} && head -n 6 {out}", mistake_signal=str(min(nums, key=str)),
        tags=["sort", "text-processing"], topic="data-processing",
    )  # fmt: skip


def wc_number(rng: random.Random) -> Drill:
    """"Write only the number": ``wc -l FILE`` also prints the file name (fix: ``wc -l < FILE``)."""
    src = f"{rng.choice(['/data', '/var/log', '/srv/in'])}/{rng.choice(WORDS)}.{rng.choice(['log', 'txt', 'csv'])}"
    out = f"{rng.choice(['/app', '/root'])}/{rng.choice(['count', 'lines', 'total'])}-{_tok(rng, 4)}.txt"
    n = rng.randint(7, 300)
    text = "".join(f"{rng.choice(WORDS)},{rng.randint(0, 99)}\n" for _ in range(n))
    instruction = _pick(rng, [
        "Write the number of lines in `{src}` to `{out}`: the file must contain only the number.",
        "Count the lines of `{src}` and save just that number (nothing else) in `{out}`.",
        "Put the line count of `{src}` into `{out}`, as a bare number.",
    ], src=src, out=out)  # fmt: skip
    return Drill(
        family="wc-number", category="premature_completion", instruction=instruction,
        files={src: EnvFile(text), "/app/.keep": EnvFile("")},
        checks=[Check(f'[ "$(tr -d " \\t" < {out} 2>/dev/null)" = "{n}" ]', f"{out} does not hold only the number {n}")],
        solution=[f"wc -l < {src} > {out}"], first_mistake=f"wc -l {src} > {out} && cat {out}",
        mistake_signal=f"{n} {src}", tags=["wc", "output-format"], topic="data-processing",
    )  # fmt: skip


FAMILIES: dict[str, Family] = {
    f.name: f
    for f in [
        Family("mkdir-parent", Category.PATH_PERMISSION, mkdir_parent, "write a file under a folder that does not exist"),
        Family("exec-bit", Category.PATH_PERMISSION, exec_bit, "run a script without its execute bit"),
        Family("cwd-relative", Category.PATH_PERMISSION, cwd_relative, "a program that reads a file relative to its folder"),
        Family("git-identity", Category.PATH_PERMISSION, git_identity, "commit without a git identity"),
        Family("local-wheel", Category.MISSING_DEPENDENCY, local_wheel, "a package only in a local wheel folder"),
        Family("pythonpath-module", Category.MISSING_DEPENDENCY, pythonpath_module, "a module in a folder off sys.path"),
        Family("python-alias", Category.MISSING_DEPENDENCY, python_alias, "`python` is not installed, `python3` is"),
        Family("tar-format", Category.WRONG_COMMAND, tar_format, "unpack an archive with the wrong format flag"),
        Family("copy-dir", Category.WRONG_COMMAND, copy_dir, "`cp` a folder without `-r`"),
        Family("off-by-one", Category.FAULTY_IMPLEMENTATION, off_by_one, "a one-line off-by-one a check catches"),
        Family("env-var", Category.WRONG_STATE, env_var, "a program needs an unset environment variable"),
        Family("sqlite-schema", Category.WRONG_STATE, sqlite_schema, "insert rows before the tables exist"),
        Family("stale-lock", Category.WRONG_STATE, stale_lock, "a pid/lock file left by a run that is gone"),
        Family("follow-flag", Category.TIMEOUT_HANG, follow_flag, "a tool that follows its input unless given a flag"),
        Family("strip-components", Category.PREMATURE_COMPLETION, strip_components,
               "unpack an archive without its top folder (the wrong layout shows no error)"),
        Family("sort-numeric", Category.PREMATURE_COMPLETION, sort_numeric, "`sort` orders numbers as text (no error)"),
        Family("wc-number", Category.PREMATURE_COMPLETION, wc_number, "`wc -l FILE` prints the name too; write only the number"),
    ]
}
"""Every drill family by name (report order: by error category)."""

DEFAULT_OOD_FAMILIES: tuple[str, ...] = ("cwd-relative", "sqlite-schema")
"""Families held out whole as ``test_ood`` by default: their categories are drilled by other families."""
