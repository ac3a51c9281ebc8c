"""The user-facing docs against the code: every `pgolf` command they quote parses, every relative link
resolves, and every record format's version they state is the code's.

Each of these once drifted silently (docs/RECORDS.md said pg-train v3 after the code wrote v4; a link
pointed at an anchor no heading makes). What the docs say in prose is checked by reading them; these are
the parts a machine can hold.
"""

from __future__ import annotations

import re

import pytest

from harness.cli import build_parser
from tests.conftest import REPO
from tests.unit.harness.test_cli import surface

DOCS = (
    "README.md",
    "docs/SUBMITTING.md",
    "docs/RULES.md",
    "docs/OFFICIALS.md",
    "docs/ARCHITECTURE.md",
    "docs/RECORDS.md",
    "baselines/README.md",
    "submissions/README.md",
)


def cli_flags() -> dict[str, set[str]]:
    """{"data build": {"--docs", ...}, ...}: each command (one or two words) and its flags."""
    flags: dict[str, set[str]] = {}
    for line in surface(build_parser()):
        words = line.split()[1:]
        n = next((i for i, w in enumerate(words) if w.startswith(("-", "<"))), len(words))
        flags.setdefault(" ".join(words[:n]), set()).update(w for w in words[n:] if w.startswith("-"))
    return flags


def code_of(text: str) -> list[tuple[int, str]]:
    """(line number, code): each fenced block's lines (a trailing backslash joins the next) and each inline span."""
    out: list[tuple[int, str]] = []
    fenced = False
    pending = ""
    for i, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        if fenced:
            if line.rstrip().endswith("\\"):
                pending += line.rstrip()[:-1] + " "
                continue
            out.append((i, pending + line))
            pending = ""
        else:
            out += [(i, span) for span in re.findall(r"`([^`]+)`", line)]
    return out


PGOLF = re.compile(r"(?:^|[\s;&(])pgolf\s+([a-z][a-z-]*)(?![a-z-])(?:\s+([a-z][a-z-]*)(?![a-z-]))?(?!:)")
"""`pgolf CMD [SUB]`, not the card's `pgolf result:` line."""


def quoted_commands(text: str, commands: dict[str, set[str]]) -> list[tuple[int, str, str, list[str]]]:
    """(line, code, command, flags) for every `pgolf ...` the text quotes as code; command "" when unknown."""
    found = []
    for line, code in code_of(text):
        starts = [m for m in PGOLF.finditer(code) if not code[m.end() :].startswith(":")]
        for k, m in enumerate(starts):
            end = starts[k + 1].start() if k + 1 < len(starts) else len(code)
            # the command's own words: up to a shell operator (`\|` inside a table cell is an alternative)
            rest = re.split(r"&&|;|(?<!\\)\s\|\s", code[m.end() : end])[0]
            two = f"{m.group(1)} {m.group(2)}"
            command = two if two in commands else m.group(1) if m.group(1) in commands else ""
            if command == m.group(1) and m.group(2):
                rest = m.group(2) + rest
            found.append((line, code, command, re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)", rest)))
    return found


@pytest.mark.parametrize("doc", DOCS)
def test_every_pgolf_command_the_docs_quote_is_on_the_cli(doc):
    commands = cli_flags()
    wrong = []
    for line, code, command, flags in quoted_commands((REPO / doc).read_text(), commands):
        if not command:
            wrong.append(f"{doc}:{line}: no such command: {code.strip()[:100]}")
            continue
        wrong += [
            f"{doc}:{line}: pgolf {command} has no {flag}: {code.strip()[:100]}"
            for flag in flags
            if flag not in commands[command] | {"--help"}
        ]
    assert not wrong, "\n".join(wrong)


def test_the_command_check_catches_a_wrong_flag_and_a_wrong_command():
    commands = cli_flags()
    text = "`pgolf run DIR --preset cpu --seeds 3` and\n```\npgolf score A \\\n  --submission D --dat D\npgolf rnu X\n```\n"
    got = [(line, command, flags) for line, _, command, flags in quoted_commands(text, commands)]
    assert got == [(1, "run", ["--preset", "--seeds"]), (4, "score", ["--submission", "--dat"]), (5, "", [])]
    assert "--seeds" not in commands["run"] and "--dat" not in commands["score"]
    assert quoted_commands("`pgolf bench runner\\|score`, `┌─ pgolf result: x`", commands) == [
        (1, "pgolf bench runner\\|score", "bench runner", [])
    ]


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


@pytest.mark.parametrize("doc", DOCS)
def test_every_relative_link_in_the_docs_resolves(doc):
    path = REPO / doc
    wrong = []
    for line, text in enumerate(path.read_text().splitlines(), 1):
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+:", target):
                continue
            file, _, anchor = target.partition("#")
            dest = (path.parent / file).resolve() if file else path
            if not dest.exists():
                wrong.append(f"{doc}:{line}: {target}: no such file")
            elif anchor and dest.suffix == ".md":
                headings = re.findall(r"^#+\s+(.*)$", dest.read_text(), re.MULTILINE)
                if anchor not in {slug(h) for h in headings}:
                    wrong.append(f"{doc}:{line}: {target}: no heading makes #{anchor}")
    assert not wrong, "\n".join(wrong)


def format_versions() -> dict[str, int]:
    """Every record format the docs give a version, with the version the code writes."""
    from data.build import TRANSFORM_RECORD_FORMAT, TRANSFORM_RECORD_VERSION
    from data.disjoint import VAL_DIGESTS_FORMAT, VAL_DIGESTS_VERSION
    from data.manifest import MANIFEST_FORMAT, MANIFEST_VERSION
    from harness.commands.preflight import CHECK_FORMAT, CHECK_FORMAT_VERSION
    from harness.config import CONFIG_FORMAT, CONFIG_FORMAT_VERSION
    from harness.records import queue, reproduce
    from harness.records.chain import CHAIN_FORMAT, CHAIN_FORMAT_VERSION
    from harness.records.compare import COMPARE_FORMAT, COMPARE_FORMAT_VERSION
    from harness.records.leaderboard import LEADERBOARD_FORMAT, LEADERBOARD_FORMAT_VERSION
    from harness.records.verify import VERIFY_FORMAT, VERIFY_FORMAT_VERSION
    from harness.run.result import RESULT_FORMAT, RESULT_FORMAT_VERSION
    from harness.train.rank import TRAIN_FORMAT, TRAIN_FORMAT_VERSION
    from scoring.artifact.format import ARTIFACT_FORMAT, ARTIFACT_VERSION
    from scoring.artifact.pack import PACK_FORMAT, PACK_FORMAT_VERSION
    from scoring.score.legacy import LEGACY_SCORE_FORMAT, LEGACY_SCORE_VERSION
    from scoring.score.record import SCORE_FORMAT, SCORE_FORMAT_VERSION

    return {
        CONFIG_FORMAT: CONFIG_FORMAT_VERSION,
        TRAIN_FORMAT: TRAIN_FORMAT_VERSION,
        PACK_FORMAT: PACK_FORMAT_VERSION,
        SCORE_FORMAT: SCORE_FORMAT_VERSION,
        LEGACY_SCORE_FORMAT: LEGACY_SCORE_VERSION,
        RESULT_FORMAT: RESULT_FORMAT_VERSION,
        VERIFY_FORMAT: VERIFY_FORMAT_VERSION,
        ARTIFACT_FORMAT: ARTIFACT_VERSION,
        CHECK_FORMAT: CHECK_FORMAT_VERSION,
        COMPARE_FORMAT: COMPARE_FORMAT_VERSION,
        LEADERBOARD_FORMAT: LEADERBOARD_FORMAT_VERSION,
        CHAIN_FORMAT: CHAIN_FORMAT_VERSION,
        queue.TRIAGE_FORMAT: queue.FORMAT_VERSION,
        queue.JOB_FORMAT: queue.FORMAT_VERSION,
        queue.SUMMARY_FORMAT: queue.FORMAT_VERSION,
        reproduce.REPRO_FORMAT: reproduce.REPRO_FORMAT_VERSION,
        reproduce.RUN_FORMAT: reproduce.RUN_FORMAT_VERSION,
        MANIFEST_FORMAT: MANIFEST_VERSION,
        VAL_DIGESTS_FORMAT: VAL_DIGESTS_VERSION,
        TRANSFORM_RECORD_FORMAT: TRANSFORM_RECORD_VERSION,
    }


def stated_versions(text: str) -> list[tuple[str, int, str]]:
    """(format, version, where) for "`pg-x` v2", "`pg-x` version 2" and RECORDS.md's table rows."""
    out = []
    flat = re.sub(r"\s+", " ", text)
    for m in re.finditer(r"`(pg-[a-z-]+)`,? (?:v|version )(\d+)", flat):
        out.append((m.group(1), int(m.group(2)), flat[max(0, m.start() - 40) : m.end()]))
    for row in re.findall(r"^\|.*\|$", text, re.MULTILINE):
        cells = [c.strip() for c in row.strip("|").split("|")]
        if len(cells) > 2 and (v := re.fullmatch(r"(\d+)(?: each)?", cells[2])):
            out += [(name, int(v.group(1)), row[:80]) for name in re.findall(r"`(pg-[a-z-]+)`", cells[1])]
    return out


def test_every_format_version_the_docs_state_is_the_code_s():
    code = format_versions()
    stated = [(doc, *s) for doc in DOCS for s in stated_versions((REPO / doc).read_text())]
    assert {name for _, name, _, _ in stated} >= {"pg-train", "pg-score", "pg-chain", "pg-dataset"}
    wrong = [
        f"{doc}: {name} v{version} ({where!r}); the code writes "
        + (
            f"v{code[name]}"
            if name in code
            else "a format this test does not know: add it to format_versions"
        )
        for doc, name, version, where in stated
        if code.get(name) != version
    ]
    assert not wrong, "\n".join(wrong)


def status_lists() -> dict[str, list[str]]:
    """The statuses each doc lists besides RULES.md's table (tests/unit/test_statuses.py holds that one): the
    OFFICIALS.md 'Statuses' table's rows, RECORDS.md's pg-result `status` cell, README's and ARCHITECTURE's
    verdict paragraphs."""

    def section(doc: str, start: str, end: str) -> str:
        text = (REPO / doc).read_text()
        at = text.index(start)
        return text[at : text.index(end, at + len(start))]

    officials = section("docs/OFFICIALS.md", "## Statuses", "\n## ")
    records = section("docs/RECORDS.md", "## `pg-result`", "\n## ")
    return {
        "docs/OFFICIALS.md": re.findall(r"^\| `([a-z_]+)` \|", officials, re.MULTILINE),
        "docs/RECORDS.md": re.findall(r"`([a-z_]+)`", re.search(r"^\| `status` \|(.*)$", records, re.M)[1]),
        "README.md": re.findall(r"`([a-z_]+)`", section("README.md", "**Verdicts**", "\n- **")),
        "docs/ARCHITECTURE.md": re.findall(
            r"`([a-z_]+)`", section("docs/ARCHITECTURE.md", "## Verdicts", "names live")
        ),
    }


def test_every_doc_that_lists_the_statuses_lists_every_one():
    from scoring.statuses import STATUSES

    lists = status_lists()
    assert lists["docs/OFFICIALS.md"] == list(STATUSES)
    assert lists["docs/RECORDS.md"] == list(STATUSES)
    for doc in ("README.md", "docs/ARCHITECTURE.md"):
        missing = [s for s in STATUSES if s not in lists[doc]]
        assert not missing, f"{doc}'s verdicts leave out {missing}"
