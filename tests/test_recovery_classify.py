"""The error classifier (reterm.recovery): the labelled-set report, real command output, the shell
helpers, and the LLM-judge path with a scripted policy."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from reterm.policies.base import EndpointError, Generation
from reterm.recovery import (
    Category,
    Classifier,
    LLMJudge,
    StepRecord,
    classify_step,
    evaluate,
    load_labelled,
    parse_judge_answer,
    shell,
)
from reterm.recovery.classifier_eval import score
from reterm.recovery.taxonomy import FAILURE_CATEGORIES, LABELS, parse_category

REPO = Path(__file__).resolve().parents[1]
LABELLED = REPO / "tests" / "data" / "recovery_labelled.yaml"


# ------------------------------------------------------------------------------ labelled set
@pytest.fixture(scope="module")
def labelled():
    return load_labelled(LABELLED)


def test_labelled_set_shape(labelled):
    assert len(labelled) >= 60
    counts = {lab: sum(r.label is lab for r in labelled) for lab in LABELS}
    assert all(n >= 3 for n in counts.values()), counts  # every category several times, none and infra too
    assert {r.split for r in labelled} == {"dev", "heldout", "heldout2", "heldout3"}


def test_classifier_report_per_category(labelled, tmp_path):
    """Prints (pytest -s) and writes the per-category precision/recall/F1 tables; asserts floors."""
    sections = []
    reports = {}
    for split in ("dev", "heldout", "heldout2", "heldout3", "all"):
        chosen = labelled if split == "all" else [r for r in labelled if r.split == split]
        reports[split] = evaluate(chosen)
        sections.append(reports[split].to_markdown(f"{split}: {len(chosen)} records"))
    # which steps would be sent to an LLM judge, and how many of the rules' errors are among them
    judge = LLMJudge(policy=None)
    results = [classify_step(r.record) for r in labelled]
    routed = [r.record.id for r, res in zip(labelled, results) if judge.wants(res)]
    wrong = [r.record.id for r, res in zip(labelled, results) if res.label is not r.label]
    sections.append(f"routed to an LLM judge (other or confidence < {judge.threshold}): {len(routed)} records; "
                    f"of the rules' {len(wrong)} errors, {len(set(wrong) & set(routed))} would be routed.")
    text = "\n\n".join(sections)
    (tmp_path / "recovery_classifier_report.md").write_text(text + "\n")
    print("\n" + text)

    assert reports["dev"].macro_f1 >= 0.95
    for split in ("heldout", "heldout2", "heldout3"):
        assert reports[split].macro_f1 >= 0.8, split
    overall = reports["all"]
    assert overall.macro_f1 >= 0.9
    for cat in FAILURE_CATEGORIES:
        assert overall.scores[cat.value].recall >= 0.75, cat
    # an agent failure must never be dropped as an infrastructure fault
    assert overall.scores["infra"].precision == 1.0


def test_load_labelled_errors_name_file_and_field(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "a", "command": "ls", "output": "", "exit_status": 0, "label": "nonsense"}\n')
    with pytest.raises(ValueError, match=r"bad.jsonl record 0 \(id 'a'\): field 'label'.*nonsense"):
        load_labelled(bad)
    bad.write_text('{"id": "a", "command": "ls", "exit_status": "one", "label": "none"}\n')
    with pytest.raises(ValueError, match="field 'exit_status'"):
        load_labelled(bad)
    bad.write_text('{"id": "a", "label": "none"}\n{"id": "a", "label": "none"}\n')
    with pytest.raises(ValueError, match="duplicate id 'a'"):
        load_labelled(bad)
    bad.write_text('{"id": "a", "command": "ls"}\n')
    with pytest.raises(ValueError, match="missing field 'label'"):
        load_labelled(bad)


def test_score_counts():
    from reterm.recovery.classify import Classification

    gold = [("a", Category.NONE), ("b", Category.OTHER), ("c", Category.OTHER)]
    pred = [Classification(Category.NONE, 1, "r"), Classification(Category.NONE, 1, "r"),
            Classification(Category.OTHER, 1, "r")]
    rep = score(gold, pred)
    assert rep.scores["none"].precision == 0.5 and rep.scores["none"].recall == 1.0
    assert rep.scores["other"].precision == 1.0 and rep.scores["other"].recall == 0.5
    assert abs(rep.macro_f1 - (2 / 3 + 2 / 3) / 2) < 1e-9
    assert rep.errors == [("b", "other", "none", "r")]


# ------------------------------------------------------------------------ real command output
def _have(*tools):
    return all(shutil.which(t) for t in tools)


REAL_CASES = [
    # (id, command, previous commands, expected label, tools needed)
    ("unknown-program", "nosuchprogram_xyz --help", [], Category.MISSING_DEPENDENCY, ()),
    ("missing-module", "{py} -c 'import no_such_module_xyz'", [], Category.MISSING_DEPENDENCY, ()),
    ("grep-nothing", "grep zzz_nothing notes.txt", [], Category.NONE, ("grep",)),
    ("ls-probe", "ls missing_dir_xyz", [], Category.NONE, ("ls",)),
    ("cat-missing", "cat missing_file_xyz.txt", [], Category.PATH_PERMISSION, ("cat",)),
    ("cd-missing", "cd missing_dir_xyz && ls", [], Category.PATH_PERMISSION, ()),
    ("git-not-repo", "git log -1", [], Category.PATH_PERMISSION, ("git",)),
    ("bash-arith", "echo $(( 3 + ))", [], Category.WRONG_COMMAND, ()),
    ("bash-syntax", "if then fi", [], Category.WRONG_COMMAND, ()),
    ("py-inline-syntax", "{py} -c \"print 'x'\"", [], Category.WRONG_COMMAND, ()),
    ("mkdir-exists", "mkdir d && mkdir d", [], Category.WRONG_STATE, ("mkdir",)),
    ("py-own-syntax", "{py} bad.py", ["printf 'def f(:\\n    pass\\n' > bad.py"], Category.FAULTY_IMPLEMENTATION, ()),
    ("py-own-exception", "{py} calc.py", ["printf 'print(1/0)\\n' > calc.py"], Category.FAULTY_IMPLEMENTATION, ()),
    ("timeout-124", "timeout 0.5 sleep 5", [], Category.TIMEOUT_HANG, ("timeout", "sleep")),
    ("diff-differs", "diff notes.txt other.txt", [], Category.NONE, ("diff",)),
    ("sqlite-syntax", "sqlite3 x.db 'SELEC 1;'", [], Category.WRONG_COMMAND, ("sqlite3",)),
    ("sqlite-no-table", "sqlite3 x.db 'SELECT * FROM orders;'", [], Category.WRONG_STATE, ("sqlite3",)),
    ("gcc-header", "printf '#include <nosuchheader_xyz.h>\\nint main(){}\\n' > m.c && gcc m.c", [],
     Category.MISSING_DEPENDENCY, ("gcc",)),
    ("gcc-own-error", "gcc own.c", ["printf 'int main(){ return x; }\\n' > own.c"], Category.FAULTY_IMPLEMENTATION, ("gcc",)),
    ("jq-syntax", "echo '{}' | jq '.a |'", [], Category.WRONG_COMMAND, ("jq",)),
    ("grep-bad-option", "grep --recursve x .", [], Category.WRONG_COMMAND, ("grep",)),
    ("make-unknown-target", "make instal", ["printf 'all:\\n\\ttrue\\n' > Makefile"], Category.WRONG_COMMAND, ("make",)),
]


@pytest.mark.parametrize("case", REAL_CASES, ids=[c[0] for c in REAL_CASES])
def test_real_command_output(case, tmp_path):
    """Run the command in a real bash in a scratch folder and classify what the tools really print."""
    _, command, previous, expected, tools = case
    if not _have("bash", *tools):
        pytest.skip(f"needs {tools}")
    py = sys.executable
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "LANG": "C.UTF-8",
           "GIT_CEILING_DIRECTORIES": str(tmp_path.parent)}
    (tmp_path / "notes.txt").write_text("alpha\nbeta\n")
    (tmp_path / "other.txt").write_text("alpha\ngamma\n")
    previous = [p.replace("{py}", py) for p in previous]
    for p in previous:
        subprocess.run(["bash", "-c", p], cwd=tmp_path, env=env, check=True, timeout=30)
    command = command.replace("{py}", py)
    proc = subprocess.run(["bash", "-c", command], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=30)
    output = proc.stdout + proc.stderr
    agent_files = [f for p in previous for f in shell.written_files(p)]
    record = StepRecord(command=command, output=output, exit_status=proc.returncode,
                        previous_commands=previous, agent_files=agent_files)
    result = classify_step(record)
    assert result.label is expected, f"{command!r} -> {output!r} (exit {proc.returncode}): {result}"


# ------------------------------------------------------------------------------ shell helpers
def test_segments_and_programs():
    segs = shell.segments("cd /app && sudo -u app timeout 5 python3 -m pytest -q tests/ || true")
    assert [(s.op, s.program) for s in segs] == [("", "cd"), ("&&", "pytest"), ("||", "true")]
    assert segs[1].timeout_wrapped and shell.tolerates_failure(segs) and shell.runs_tests(segs)
    segs = shell.segments("cat > a.py <<'EOF'\nx = 1; y = 2 | 3\nEOF\npython3 a.py")
    assert [s.program for s in segs] == ["cat", "python3"]  # here-document body is data
    segs = shell.segments("python3 -c 'import a; b()' | tee log.txt")
    assert [s.program for s in segs] == ["python3", "tee"]  # quoted ; is not a separator
    assert shell.segments("") == [] and shell.segments(None) == []
    assert [s.program for s in shell.segments("echo 'unbalanced")] == ["echo"]  # never raises


def test_probes_and_viewers():
    assert shell.probe_exit_is_benign(shell.segments("grep -rn TODO src/"), 1)
    assert not shell.probe_exit_is_benign(shell.segments("grep -rn TODO src/"), 2)  # 2 is grep's error
    assert shell.probe_exit_is_benign(shell.segments("which jq && jq . f.json"), 1)
    assert not shell.probe_exit_is_benign(shell.segments("grep x f; make"), 2)
    assert shell.probe_exit_is_benign(shell.segments("pip show requests"), 1)
    assert not shell.probe_exit_is_benign(shell.segments("kill %1"), 1)
    assert shell.is_read_only(shell.segments("cd /var/log && tail -n 5 app.log | grep -i error"))
    assert not shell.is_read_only(shell.segments("cat a > b"))
    assert not shell.is_read_only(shell.segments("python3 x.py | head"))


def test_written_files():
    cmd = "cat > /app/solve.py <<'EOF'\nprint(1) > 2\nEOF\nsed -i 's/a/b/' conf.ini && cp a.txt /out/b.txt; echo x | tee -a log.txt 2>&1 >/dev/null"
    assert shell.written_files(cmd) == ["/app/solve.py", "conf.ini", "/out/b.txt", "log.txt"]
    assert shell.path_matches("/app/solve.py", ["solve.py"]) and not shell.path_matches("/app/x.py", ["solve.py"])


def test_classifier_details():
    # errors printed while the exit status says success still count, with lower confidence
    masked = classify_step(StepRecord(command="./build.sh | tee log", exit_status=0,
                                      output="./build.sh: line 3: cmake: command not found\n"))
    assert masked.label is Category.MISSING_DEPENDENCY and masked.confidence < 0.9
    # error words in a file shown by a viewer are content
    assert classify_step(StepRecord(command="cat app.log", exit_status=0,
                                    output="ERROR: Permission denied\n")).label is Category.NONE
    # the installed-but-not-on-PATH context rule
    r = StepRecord(command="black .", exit_status=127, output="bash: black: command not found\n",
                   previous_commands=["python3 -m venv .venv", ".venv/bin/pip install black"])
    assert classify_step(r).label is Category.WRONG_STATE
    # a typo of a known program is a wrong command; an unknown tool is a missing dependency (names of
    # three letters or fewer are too ambiguous to call typos: gti stays a missing dependency)
    assert classify_step(StepRecord(command="gti status", exit_status=127,
                                    output="bash: gti: command not found")).label is Category.MISSING_DEPENDENCY
    assert classify_step(StepRecord(command="pytohn3 a.py", exit_status=127,
                                    output="bash: pytohn3: command not found")).label is Category.WRONG_COMMAND
    # a terminal that echoes the typed line: the echo is not output
    echoed = StepRecord(command="ls", exit_status=0, output="root@box:/app# ls\nerror.log  notes.ls\n")
    assert classify_step(echoed).label is Category.NONE
    # a REPL the agent opened is not a failure; a prompt nobody asked for is a hang
    assert classify_step(StepRecord(command="python3", exit_status=None, output="Python 3.11\n>>> ")).label \
        is Category.NONE
    assert classify_step(StepRecord(command="apt-get install nginx", exit_status=None,
                                    output="Do you want to continue? [Y/n] ")).label is Category.TIMEOUT_HANG
    # submit / parse errors / an unknown non-zero exit
    assert classify_step(StepRecord(tool="submit", verifier_passed=False)).label is Category.PREMATURE_COMPLETION
    assert classify_step(StepRecord(tool="submit", verifier_passed=None)).label is Category.NONE
    assert classify_step(StepRecord(tool="parse_error", output="no tool call")).label is Category.NONE
    unknown = classify_step(StepRecord(command="frob --go", exit_status=3, output="frobnication went sideways\n"))
    assert unknown.label is Category.OTHER and unknown.confidence < 0.6


def test_parse_category():
    assert parse_category("Missing dependency") is Category.MISSING_DEPENDENCY
    assert parse_category("wrong-state") is Category.WRONG_STATE
    with pytest.raises(ValueError, match="unknown error category 'oops'.*missing_dependency"):
        parse_category("oops")


# ---------------------------------------------------------------------------------- LLM judge
class ScriptedJudge:
    """A Policy that answers judge prompts from a list (or raises), recording the batches it got."""

    name = "scripted-judge"

    def __init__(self, answers=None, error: Exception | None = None):
        self.answers = list(answers or [])
        self.error = error
        self.batches: list[list[list[dict]]] = []

    def generate(self, batch, tools):
        self.batches.append(batch)
        if self.error is not None:
            raise self.error
        return [Generation(text=self.answers.pop(0)) for _ in batch]


UNSURE = StepRecord(command="frob --go", exit_status=3, output="frobnication went sideways\n", id="unsure")
SURE = StepRecord(command="python3 a.py", exit_status=1, output="ModuleNotFoundError: No module named 'numpy'\n")
FINE = StepRecord(command="ls", exit_status=0, output="a.py\n")


def test_judge_is_asked_only_about_unsure_failures_in_one_batch():
    policy = ScriptedJudge(['{"category": "wrong_state"}', "Category: wrong command"])
    other = StepRecord(command="widget", exit_status=9, output="widget refused\n")
    results = Classifier(judge=LLMJudge(policy)).classify([SURE, UNSURE, FINE, other])
    assert len(policy.batches) == 1 and len(policy.batches[0]) == 2  # only the two unsure failures
    assert results[0].label is Category.MISSING_DEPENDENCY and results[0].source == "rules"
    assert results[1].label is Category.WRONG_STATE and results[1].source == "judge"
    assert results[1].rules_label is Category.OTHER
    assert results[2].label is Category.NONE
    assert results[3].label is Category.WRONG_COMMAND
    # the prompt carries the taxonomy and the step
    system, user = policy.batches[0][0]
    assert all(c.value in system["content"] for c in FAILURE_CATEGORIES)
    assert "frob --go" in user["content"] and "Exit status: 3" in user["content"]


@pytest.mark.parametrize("error", [EndpointError("server down"), RuntimeError("bad backend")])
def test_judge_failure_falls_back_to_rules(error):
    results = Classifier(judge=LLMJudge(ScriptedJudge(error=error))).classify([UNSURE])
    assert results[0].label is Category.OTHER and results[0].source == "rules"
    assert "judge_failed" in results[0].rule


def test_judge_unparseable_or_wrong_length_falls_back():
    results = Classifier(judge=LLMJudge(ScriptedJudge(["banana bread"]))).classify([UNSURE])
    assert results[0].label is Category.OTHER and "judge_unparsed" in results[0].rule

    class Short(ScriptedJudge):
        def generate(self, batch, tools):
            return []

    results = Classifier(judge=LLMJudge(Short())).classify([UNSURE])
    assert results[0].label is Category.OTHER and "judge_failed" in results[0].rule


@pytest.mark.parametrize(
    "text, expected",
    [
        ('{"category": "path_permission"}', Category.PATH_PERMISSION),
        ('Sure! ```json\n{"category": "timeout_hang", "reason": "hangs"}\n```', Category.TIMEOUT_HANG),
        ('{"label": "Wrong-Command"}', Category.WRONG_COMMAND),
        ("<think>could be wrong_command or other</think>\nmissing_dependency", Category.MISSING_DEPENDENCY),
        ("category: faulty implementation", Category.FAULTY_IMPLEMENTATION),
        ("It is not wrong_command; the answer is wrong_state.", Category.WRONG_STATE),
        ("none", Category.NONE),
        ('{"category": "infra"}', None),  # the judge may not declare infrastructure faults
        ('{"category": 3}', None),
        ("no idea", None),
        ("", None),
        (None, None),
        ("<think>unterminated thinking about other", None),
    ],
)
def test_parse_judge_answer(text, expected):
    assert parse_judge_answer(text) is expected


def test_taxonomy_doc_defines_every_category():
    doc = (REPO / "docs" / "ERROR_TAXONOMY.md").read_text()
    for cat in LABELS:
        assert f"### `{cat.value}`" in doc, cat
    assert len(REAL_CASES) >= 20


def test_classifier_never_raises_on_random_input():
    import random
    import string

    rng = random.Random(7)
    pieces = ["Traceback (most recent call last):\n", '  File "x.py", line 3\n', "command not found", " || true",
              "<<EOF\n", "'", '"', "$(", "{", ";", "&&", "|", "\n", ">>> ", "No such file", "fatal: ", "usage: x"]

    def junk(n):
        return "".join(rng.choice(pieces) if rng.random() < 0.3 else rng.choice(string.printable)
                       for _ in range(rng.randint(0, n)))

    records = [StepRecord(command=junk(60) or None, output=junk(300), exit_status=rng.choice([None, 0, 1, 2, 127, 124]),
                          timed_out=rng.random() < 0.1, previous_commands=[junk(30)], agent_files=[junk(8)])
               for _ in range(500)]
    labels = Classifier().classify(records)
    assert len(labels) == 500 and all(lab.label in LABELS and 0 <= lab.confidence <= 1 for lab in labels)
    tb = 'Traceback (most recent call last):\n  File "/app/a.py", line 1, in <module>\nKeyError: \'a\'\n'
    huge = StepRecord(command="python3 a.py", exit_status=1, output="x" * 2_000_000 + "\n" + tb)
    assert classify_step(huge).label is Category.FAULTY_IMPLEMENTATION  # long outputs: the tail is read


# ------------------------------------------------------------- the harness's observation format
from reterm.agent.protocol import format_observation  # noqa: E402


@pytest.mark.parametrize(
    "command, observation, exit_status, timed_out, expected",
    [
        ("jq . d.json", format_observation("bash: jq: command not found", 127), 127, False, Category.MISSING_DEPENDENCY),
        ("ls", format_observation("", 0), 0, False, Category.NONE),
        ("grep -c x f", format_observation("0", 1), 1, False, Category.NONE),
        ("python3 app.py", format_observation(" * Running on http://127.0.0.1:5000", None, timed_out=True, timeout_s=30,
                                              interrupt="sent Ctrl-C"), None, True, Category.TIMEOUT_HANG),
        ("python3", format_observation("Python 3.11.2\n>>>", None, running="python3", waiting_for_input=True),
         None, False, Category.NONE),
        ("vim notes.txt", format_observation("~\n~\n\"notes.txt\" 0L, 0B", None, running="vim", waiting_for_input=True),
         None, False, Category.NONE),
        ("apt-get install nginx", format_observation("Need to get 1,032 kB of archives.\nDo you want to continue? [Y/n]",
                                                     None, running="apt-get", waiting_for_input=True),
         None, False, Category.TIMEOUT_HANG),
        ("git log", format_observation("commit 9f1c2ab\nAuthor: Dev\n:", None, running="less", waiting_for_input=True),
         None, False, Category.TIMEOUT_HANG),
        ("python3 app.py", format_observation(" * Running on http://127.0.0.1:5000", None, running="python3",
                                              waiting_for_input=True), None, False, Category.TIMEOUT_HANG),
        ("sqlite3 app.db", format_observation("SQLite version 3.40.1\nsqlite>", None, running="sqlite3",
                                              waiting_for_input=True), None, False, Category.NONE),
        ("C-c", format_observation("^C", 130), 130, False, Category.NONE),  # the agent stopping a program
        ("", format_observation("(nothing is running: the shell waits at its prompt)"), None, False, Category.NONE),
        ("make", format_observation("main.c:3:5: error: expected ';' before '}' token\nmake: *** [Makefile:2: all] Error 1", 2),
         2, False, Category.FAULTY_IMPLEMENTATION),
    ],
)
def test_harness_observations(command, observation, exit_status, timed_out, expected):
    """Observations exactly as the harness words them (reterm.agent.protocol.format_observation)."""
    result = classify_step(StepRecord(command=command, output=observation, exit_status=exit_status, timed_out=timed_out))
    assert result.label is expected, (observation, result)


# ------------------------------------------------- the judge through the real endpoint policy
class _ChatServer:
    """A minimal OpenAI chat-completions server on 127.0.0.1: answers with ``reply(request_body)``."""

    def __init__(self, reply):
        import json as _json
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        self.requests = []
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                body = _json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                owner.requests.append(body)
                answer = {"id": "x", "object": "chat.completion", "created": 0, "model": body["model"],
                          "choices": [{"index": 0, "finish_reason": "stop",
                                       "message": {"role": "assistant", "content": reply(body)}}],
                          "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}
                data = _json.dumps(answer).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


def test_judge_through_endpoint_policy():
    from reterm.policies.endpoint import EndpointPolicy

    def reply(body):
        user = body["messages"][-1]["content"]
        return '<think>hmm</think>{"category": "wrong_state"}' if "frob" in user else "Category: wrong command"

    server = _ChatServer(reply)
    try:
        endpoint = EndpointPolicy("judge-model", base_url=server.url, api_key_env="RETERM_TEST_UNSET_KEY",
                                  max_retries=0, backoff_s=0.01)
        other = StepRecord(command="widget", exit_status=9, output="widget refused\n")
        results = Classifier(judge=LLMJudge(endpoint)).classify([UNSURE, SURE, other])
    finally:
        server.close()
    assert [r.label for r in results] == [Category.WRONG_STATE, Category.MISSING_DEPENDENCY, Category.WRONG_COMMAND]
    assert results[0].rule == "judge(openai:judge-model)"
    assert len(server.requests) == 2 and "tools" not in server.requests[0]
    assert server.requests[0]["messages"][0]["role"] == "system"

    # the endpoint is down: EndpointError inside the judge, the rules' labels stand
    down = EndpointPolicy("judge-model", base_url=server.url, api_key_env="RETERM_TEST_UNSET_KEY",
                          max_retries=0, backoff_s=0.01, timeout_s=2)
    results = Classifier(judge=LLMJudge(down)).classify([UNSURE])
    assert results[0].label is Category.OTHER and "judge_failed" in results[0].rule
