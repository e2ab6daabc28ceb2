"""README.md read as a product page: short, its set-up commands named, every link resolving.

The commands themselves run in integration tests (test_launch_table.py runs the
launch table, test_own_script.py the scripts, test_first_hour.py the
multi-worker row through a pipe); this checks what a reader follows first.
"""

import os
import re

import pytest

from tests.conftest import REPO

README = os.path.join(REPO, "README.md")
# The README and the pages it sends readers to, which link on in turn.
PAGES = ["README.md", "slurm/README.md"] + sorted(
    f"docs/{name}" for name in os.listdir(os.path.join(REPO, "docs")) if name.endswith(".md"))
LINK = re.compile(r"\]\(([^)\s]+)\)")


def _text(page: str) -> str:
    return open(os.path.join(REPO, page), encoding="utf-8").read()


def _anchor(heading: str) -> str:
    """GitHub's anchor of a Markdown heading."""
    slug = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return slug.replace(" ", "-")


def test_readme_is_about_220_lines_at_most():
    assert len(_text("README.md").splitlines()) <= 220


def test_readme_names_the_two_set_up_commands_and_the_fast_tier():
    quick = _text("README.md").split("## Quick start", 1)[1].split("\n## ", 1)[0]
    assert 'pip install -e ".[dev]" && python -m tfdist.train ' in quick
    assert "python -m pytest -q " in quick
    assert 'python -m pytest -q -m "not integration"' in quick


def test_readme_says_what_a_rerun_does():
    text = _text("README.md")
    assert "Rerunning a command resumes its run" in text
    assert "already finished (N" in text and "nothing to do" in text


@pytest.mark.parametrize("page", PAGES)
def test_every_relative_link_resolves(page):
    broken = []
    for target in LINK.findall(_text(page)):
        if re.match(r"[a-z]+:", target):
            continue  # http(s), mailto: not this repository's to check
        path, _, anchor = target.partition("#")
        full = os.path.normpath(os.path.join(REPO, os.path.dirname(page), path) if path
                                else os.path.join(REPO, page))
        if not os.path.exists(full):
            broken.append(target)
        elif anchor and full.endswith(".md"):
            headings = re.findall(r"^#+ (.+)$", open(full, encoding="utf-8").read(), re.M)
            if anchor not in {_anchor(h) for h in headings}:
                broken.append(target)
    assert broken == [], f"{page}: links that do not resolve: {broken}"


def test_the_link_check_finds_a_broken_link():
    assert LINK.findall("see [x](docs/none.md#a) and [y](http://e)") == ["docs/none.md#a",
                                                                        "http://e"]
    assert _anchor("Stages in processes of their own") == "stages-in-processes-of-their-own"
    assert _anchor("## From the README: overhead".lstrip("# ")) == "from-the-readme-overhead"


def test_own_script_md_names_every_public_member_of_distributed():
    """#48: `dist.model()` and `dist.compile_kwargs()` were missing from the list."""
    from tfdist.distributed import Distributed

    text = _text("docs/own_script.md")
    members = [n for n in vars(Distributed) if not n.startswith("_")]
    assert len(members) >= 10, members
    missing = [n for n in members if f"`{n}" not in text]
    assert not missing, f"docs/own_script.md does not name Distributed.{missing}"
