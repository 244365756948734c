"""The pages of docs/ hold together: every link between them (and to files of the repository)
resolves, anchors included, and every error message quoted in docs/troubleshooting.md still
occurs in the source, so the page cannot describe messages the code no longer prints."""

from __future__ import annotations

import re

from tests.docs.blocks import DOCS
from tests.runs import ROOT

LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*$", re.M)
FENCED = re.compile(r"^```.*?^```", re.M | re.S)
QUOTED = re.compile(r"^### `([^`]+)`\s*$", re.M)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to dashes."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(path) -> set[str]:
    text = FENCED.sub("", path.read_text(encoding="utf-8"))
    return {slug(h) for h in HEADING.findall(text)}


def test_links_between_pages_resolve():
    broken = []
    pages = [*DOCS.glob("*.md"), ROOT / "README.md"]
    for page in pages:
        text = FENCED.sub("", page.read_text(encoding="utf-8"))
        for target in LINK.findall(text):
            if re.match(r"[a-z]+:", target):  # http(s), mailto: not checked here
                continue
            path, _, anchor = target.partition("#")
            resolved = (page.parent / path).resolve() if path else page
            if not resolved.exists():
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such file)")
            elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such heading)")
    assert broken == []


def test_every_page_is_in_the_index():
    index = (DOCS / "README.md").read_text(encoding="utf-8")
    missing = [p.name for p in DOCS.glob("*.md") if p.name != "README.md"
               and f"({p.name})" not in index]
    assert missing == [], f"docs/README.md does not link {missing}"


def message_literals() -> str:
    """The string literals of the code (the fixed parts of f-strings apart), without docstrings
    or comments: where a message the user sees is written."""
    import ast

    found = []
    for path in [*ROOT.glob("*.py"), *(ROOT / "megatron").rglob("*.py"),
                 *(ROOT / "tools").rglob("*.py")]:
        tree = ast.parse(path.read_text(encoding="utf-8"))
        docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                      if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef,
                                           ast.AsyncFunctionDef))
                      and node.body and isinstance(node.body[0], ast.Expr)
                      and isinstance(node.body[0].value, ast.Constant)}
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) \
                    and id(node) not in docstrings:
                found.append(node.value)
    return "\n".join(found)


def test_quoted_error_messages_still_occur_in_the_source():
    """Each heading of docs/troubleshooting.md is in a string the code prints (a docstring or
    a comment that still says it does not count)."""
    quoted = QUOTED.findall((DOCS / "troubleshooting.md").read_text(encoding="utf-8"))
    assert len(quoted) >= 25, quoted
    literals = message_literals()
    stale = [q for q in quoted if q not in literals]
    assert stale == [], f"quoted in docs/troubleshooting.md but in no message of the code: {stale}"


def test_the_readme_names_every_extra_and_what_make_test_installs():
    """README's list of extras is setup.py's, and the extras it says `make test` installs are
    the Makefile's."""
    import ast

    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    listed = readme[readme.index("Extras: "):]
    listed = set(re.findall(r"`(\w+)`", re.sub(r"\([^)]*\)", "", listed[:listed.index(". ")])))
    setup = ast.parse((ROOT / "setup.py").read_text(encoding="utf-8"))
    extras = next(ast.literal_eval(n.value) for n in setup.body if isinstance(n, ast.Assign)
                  and getattr(n.targets[0], "id", "") == "EXTRAS")
    assert listed == set(extras)
    said = re.search(r"installs with the ([\w, ]+) extras", readme)
    makefile = re.search(r'-e "\.\[([\w,]+)\]"\n.*\n.*\n\ninstall:',
                         (ROOT / "Makefile").read_text(encoding="utf-8"))
    assert said and makefile
    assert set(re.split(r", | and ", said[1])) == set(makefile[1].split(","))


def test_commands_are_in_fenced_blocks():
    """A command shown as an indented block would be neither run by test_doc_commands.py nor
    marked `not run`: every command sits in a fenced sh block."""
    command = re.compile(r"^ {4}(python|\.venv/|pip |make |bash |mkdir |scontrol |pdsh |mpirun "
                         r"|srun |sbatch |salloc |# )")
    found = []
    for page in [*DOCS.glob("*.md"), ROOT / "README.md"]:
        lines = FENCED.sub("", page.read_text(encoding="utf-8")).split("\n")
        found += [f"{page.name}: {line.strip()}" for before, line in zip([""] + lines, lines)
                  if not before.strip() and command.match(line)]
    assert found == []
