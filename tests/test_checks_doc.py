"""docs/checks.md is the reference for every check ID the code and tests cite: each cited ID has
its section there, and each section's "Tested by" names test files that exist."""

from __future__ import annotations

import re

from tests.runs import ROOT

DOC = ROOT / "docs" / "checks.md"
CITED = re.compile(r"\bA(\d{1,2})\b")


def sections() -> dict[str, str]:
    text = DOC.read_text(encoding="utf-8")
    parts = re.split(r"^## (A\d+): .*$", text, flags=re.M)
    return dict(zip(parts[1::2], parts[2::2]))


def test_every_cited_check_id_has_its_section():
    documented = set(sections())
    cited = {}
    for folder in ("megatron", "tests", "tools"):
        for path in (ROOT / folder).rglob("*.py"):
            for number in CITED.findall(path.read_text(encoding="utf-8")):
                cited.setdefault(f"A{number}", path.relative_to(ROOT))
    missing = {i: str(p) for i, p in cited.items() if i not in documented}
    assert missing == {}, f"check IDs cited but not explained in {DOC.name}: {missing}"


def test_every_section_names_tests_that_exist():
    for check, body in sections().items():
        match = re.search(r"^Tested by:(.*?)(?:\n\n|\Z)", body, flags=re.M | re.S)
        assert match, f"{check} has no 'Tested by:' line"
        files = re.findall(r"`(tests/[^`]+?\.py)`", match.group(1))
        if "no test" in match.group(1):
            continue
        assert files, f"{check}: 'Tested by:' names no test file"
        absent = [f for f in files if not (ROOT / f).is_file()]
        assert absent == [], f"{check} cites test files that do not exist: {absent}"
