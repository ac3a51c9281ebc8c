"""The tree's habits (scripts/commit_subjects.py): a commit subject of 73 characters is refused, 72 passes."""

from __future__ import annotations

from scripts.commit_subjects import SUBJECT_MAX_CHARS, long_subjects, main


def test_a_subject_one_character_too_long_is_named_with_its_length():
    ok, long = "x" * SUBJECT_MAX_CHARS, "y" * (SUBJECT_MAX_CHARS + 1)
    assert long_subjects({"a1": ok}) == []
    (line,) = long_subjects({"a1": ok, "b2": long})
    assert line.startswith(f"b2: subject of {SUBJECT_MAX_CHARS + 1} characters")


def test_the_commit_msg_hook_reads_the_subject_and_skips_comments(tmp_path, capsys):
    msg = tmp_path / "COMMIT_EDITMSG"
    msg.write_text("# a comment git adds\nshort subject\n\n" + "a long body line " * 20 + "\n")
    assert main(["--message-file", str(msg)]) == 0
    msg.write_text("z" * 100 + "\n\nbody\n")
    assert main(["--message-file", str(msg)]) == 1
    assert "100 characters" in capsys.readouterr().err
