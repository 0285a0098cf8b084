"""An evaluation interrupted inside a model resumes from that model's journal (``eval.drills``): attempts
already scored are not attempted again (a failed one only while its snapshot is kept), and the numbers equal
those of an uninterrupted run."""

from __future__ import annotations

import json

import pytest

from reterm.agent.episode import load_task
from reterm.drills import generate_drills
from reterm.eval import drills as eval_drills
from reterm.policies.scripted import OraclePolicy, ScriptedPolicy, _first_user_text
from reterm.sandbox.snapshot import Snapshot


def _half_oracle(tasks, names):
    """Solves the tasks named in ``names`` (from their start), prose on every other: passes and failures."""
    known = {load_task(tasks / n).instruction.strip(): tasks / n for n in names}
    oracle = OraclePolicy([tasks / n for n in names], name="half")

    def reply(messages):
        text = _first_user_text(messages)
        return oracle.reply(messages) if any(k in text for k in known) else "I am not sure what to do."

    return ScriptedPolicy(reply, name="half")


def test_an_interrupted_model_resumes_from_its_journal(tmp_path, monkeypatch):
    tasks = tmp_path / "drills"
    generate_drills(tasks, 0, 8, families=["mkdir-parent", "exec-bit", "off-by-one"], ood_families=[])
    test = json.loads((tasks / "splits.json").read_text())["test"]
    ids = eval_drills.spread([tasks / n for n in test], 6)
    solved = [d.name for d in ids[::2]]  # 3 of the 6 Pass@1 items pass
    monkeypatch.setattr(eval_drills, "load_policy", lambda spec, **kw: _half_oracle(tasks, solved))

    def argv(out, own_items=2):
        return ["--tasks", str(tasks), "--output", str(out), "--model", "sft=half", "--max-id", "6", "--max-ood", "0",
                "--max-states", "2", "--own-items", str(own_items), "--k-max", "1", "--max-turns", "4", "--batch", "2"]

    real = eval_drills.run_attempts
    calls: list[tuple[str, int]] = []

    async def counted(policy, dirs, **kw):
        calls.append((getattr(policy, "name", ""), len(dirs)))
        return await real(policy, dirs, **kw)

    # the uninterrupted run
    monkeypatch.setattr(eval_drills, "run_attempts", counted)
    assert eval_drills.main(argv(tmp_path / "whole")) == 0
    whole = json.loads((tmp_path / "whole" / "sft" / "per_item.json").read_text())
    assert not (tmp_path / "whole" / "sft" / eval_drills.JOURNAL).exists()  # removed with metrics.json
    assert sum(whole["pass_at_1/drills_id"].values()) == 3
    attempted_whole = sum(n for name, n in calls if name == "half")

    # a run killed after its first two batches of the model's Pass@1 attempts (4 of 6 attempted)
    calls.clear()

    async def killed(policy, dirs, **kw):
        if sum(1 for name, _ in calls if name == "half") == 2:
            raise KeyboardInterrupt
        return await counted(policy, dirs, **kw)

    for kept, out in ((True, tmp_path / "resumed"), (False, tmp_path / "resumed-released")):
        calls.clear()
        monkeypatch.setattr(eval_drills, "run_attempts", killed)
        with pytest.raises(KeyboardInterrupt):
            eval_drills.main(argv(out))
        journal = [json.loads(x) for x in (out / "sft" / eval_drills.JOURNAL).read_text().splitlines()]
        assert len(journal) == 4 and not (out / "sft" / "metrics.json").exists()
        assert sum(row["trajectory"]["outcome"] == "success" for row in journal) == 2
        failed = [row["snapshot"] for row in journal if row["trajectory"]["outcome"] == "failure"]
        assert len(failed) == 2 and all(failed)  # the failed attempts' kept snapshots, by id
        if not kept:  # their snapshots gone (released, or deleted with the cache)
            for snap in failed:
                Snapshot.load(snap).release()

        calls.clear()
        monkeypatch.setattr(eval_drills, "run_attempts", counted)
        assert eval_drills.main(argv(out)) == 0
        # Pass@1: the 2 journaled passes are reused, and the 2 journaled failures while their snapshots are kept
        # (a later step forks them); released, those 2 are attempted again, with the 2 attempts never made
        assert [n for name, n in calls if name == "half"][0] == 2  # Pass@1's attempts left, one batch of 2
        assert sum(n for name, n in calls if name == "half") == attempted_whole - (4 if kept else 2)
        assert json.loads((out / "sft" / "per_item.json").read_text()) == whole
        assert json.loads((out / "sft" / "metrics.json").read_text())["pass_at_1"] == \
            json.loads((tmp_path / "whole" / "sft" / "metrics.json").read_text())["pass_at_1"]
        assert not (out / "sft" / eval_drills.JOURNAL).exists()

    # following no own items (run_all's evaluation), no snapshot is kept and a journaled failure is reused as it is
    calls.clear()
    monkeypatch.setattr(eval_drills, "run_attempts", counted)
    assert eval_drills.main(argv(tmp_path / "whole-0", own_items=0)) == 0
    attempted_whole = sum(n for name, n in calls if name == "half")
    calls.clear()
    monkeypatch.setattr(eval_drills, "run_attempts", killed)
    with pytest.raises(KeyboardInterrupt):
        eval_drills.main(argv(tmp_path / "resumed-0", own_items=0))
    journal = [json.loads(x) for x in (tmp_path / "resumed-0" / "sft" / eval_drills.JOURNAL).read_text().splitlines()]
    assert len(journal) == 4 and [row["snapshot"] for row in journal] == [None] * 4
    calls.clear()
    monkeypatch.setattr(eval_drills, "run_attempts", counted)
    assert eval_drills.main(argv(tmp_path / "resumed-0", own_items=0)) == 0
    assert sum(n for name, n in calls if name == "half") == attempted_whole - 4
    assert json.loads((tmp_path / "resumed-0" / "sft" / "per_item.json").read_text()) == \
        json.loads((tmp_path / "whole-0" / "sft" / "per_item.json").read_text())


def test_a_journal_line_cut_by_a_kill_is_skipped(tmp_path):
    path = tmp_path / eval_drills.JOURNAL
    path.write_text(json.dumps({"key": "hf:a|4|96|x|0|t|", "trajectory": {}}) + "\n" + '{"key": "hf:a|5|96|x|1')
    assert list(eval_drills._read_journal(path)) == ["hf:a|4|96|x|0|t|"]
    assert eval_drills._read_journal(None) == {} and eval_drills._read_journal(tmp_path / "none") == {}
