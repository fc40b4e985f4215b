"""The documentation check: links and anchors resolve, runnable commands run, flags exist.

README.md and every page under docs/ are checked; the checker itself (``tests/docs.py``) is
tested on small broken samples, so that a check that finds nothing is known to be able to.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from app.cli import reference as clidoc
from tests import docs
from tests.support import ROOT

PAGES = sorted([ROOT / "README.md", *(ROOT / "docs").glob("**/*.md")])
INDEX = ROOT / "docs" / "README.md"


def _id(page: Path) -> str:
    return str(page.relative_to(ROOT))


def _runnable() -> list[tuple[Path, docs.Command]]:
    return [
        (page, command)
        for page in PAGES
        for block in docs.blocks(page.read_text(encoding="utf-8"))
        if block.runnable
        for command in docs.runnable_commands(block)
    ]


def _mentions() -> list[object]:
    return [
        pytest.param(mention, id=f"{_id(page)}:{mention.line}")
        for page in PAGES
        for mention in docs.mentions(page.read_text(encoding="utf-8"), clidoc.subcommands())
    ]


@pytest.mark.parametrize("page", PAGES, ids=_id)
def test_links_and_anchors_resolve(page: Path) -> None:
    assert docs.broken_links(page, ROOT) == []


def test_every_page_is_linked_from_the_index() -> None:
    linked = {
        (INDEX.parent / link.target.partition("#")[0]).resolve()
        for link in docs.links(INDEX.read_text(encoding="utf-8"))
        if link.target and not docs.SCHEME.match(link.target)
    }
    pages = {page.resolve() for page in PAGES if page.parent != ROOT and page != INDEX}
    assert sorted(str(p.relative_to(ROOT)) for p in pages - linked) == []


def test_readme_links_to_what_newcomers_look_for() -> None:
    # The index, and in one click: install, warn mode, the failure policies, every CLI flag.
    targets = {link.target for link in docs.links((ROOT / "README.md").read_text())}
    wanted = {
        "docs/README.md",
        "docs/install.md",
        "docs/modes.md",
        "docs/failure.md",
        "docs/cli.md",
    }
    assert sorted(wanted - targets) == []


@pytest.mark.parametrize(
    "command", [pytest.param(c, id=f"{_id(page)}:{c.line}") for page, c in _runnable()]
)
def test_runnable_command_exits_as_documented(command: docs.Command) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "app", *command.args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == command.exit, (
        f"{command.text}\nexited {done.returncode}, the page says {command.exit}\n{done.stderr}"
    )


def test_the_pages_have_runnable_commands() -> None:
    # The example commands of the front page and of the tour are checked, not only shown.
    runnable = _runnable()
    assert {page.name for page, _ in runnable} >= {"README.md", "tenants.md"}
    assert {command.args[0] for _, command in runnable} >= {"check", "who-can", "audit", "lint"}


@pytest.mark.parametrize("mention", _mentions())
def test_mentioned_flags_exist(mention: docs.Mention) -> None:
    parsers = clidoc.subcommands()
    parser = parsers.get(mention.subcommand) if mention.subcommand else None
    if mention.subcommand and parser is None:
        pytest.fail(f"no subcommand {mention.subcommand!r}; there are {sorted(parsers)}")
    known = clidoc.options(parser) if parser else {"--help", "--version", "-h"}
    assert sorted(set(mention.flags) - known) == [], f"python -m app {mention.subcommand}"


def test_cli_reference_is_generated_from_the_parsers() -> None:
    current = clidoc.DOC.read_text(encoding="utf-8")
    assert current == clidoc.generate(current), (
        f"docs/cli.md differs from what the parsers of app.cli generate: run {clidoc.REGENERATE}"
    )


def test_cli_reference_keeps_the_prose_and_replaces_a_stale_reference() -> None:
    stale = f"# Command line\n\nWhat each command is for.\n\n{clidoc.MARKER}\n\n## Reference\nold\n"
    fresh = clidoc.generate(stale)
    assert fresh != stale
    assert fresh.startswith("# Command line\n\nWhat each command is for.\n\n")
    assert fresh.endswith(clidoc.render())
    assert clidoc.generate(fresh) == fresh


def test_cli_reference_names_every_subcommand_and_flag() -> None:
    reference = clidoc.render()
    for name, parser in clidoc.subcommands().items():
        assert f"### python -m app {name}\n" in reference
        for option in clidoc.options(parser):
            assert f"`{option}`" in reference


# The checker itself, on samples.


@pytest.mark.parametrize(
    ("heading", "anchor"),
    [
        pytest.param(
            "Reads: the authorization webhook", "reads-the-authorization-webhook", id="colon"
        ),
        pytest.param(
            "Workers, memory and connections", "workers-memory-and-connections", id="comma"
        ),
        pytest.param("API-server traffic", "api-server-traffic", id="hyphen"),
        pytest.param("`python -m app serve`", "python--m-app-serve", id="code-span"),
        pytest.param(
            "Over HTTP, against a no-op webhook", "over-http-against-a-no-op-webhook", id="words"
        ),
        pytest.param("What **is** [judged](x.md)", "what-is-judged", id="emphasis-and-link"),
        pytest.param("snake_case & 1.35", "snake_case--135", id="underscore-kept"),
    ],
)
def test_slug_follows_github(heading: str, anchor: str) -> None:
    assert docs.slug(heading) == anchor


def test_repeated_headings_are_numbered_and_code_is_not_a_heading() -> None:
    text = '# Logs\n## Logs\n```sh\n# not a heading\n```\n<a id="kept"></a>\n### Logs\n'
    assert docs.anchors(text) == {"logs", "logs-1", "logs-2", "kept"}


def test_broken_links_are_found(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "b.md").write_text("# Beta\n## Two words\n")
    page = tmp_path / "docs" / "a.md"
    page.write_text(
        "# Alpha\n"
        "[ok](b.md) [ok](b.md#two-words) [ok](#alpha) [web](https://example.com/x#y)\n"
        "[missing file](c.md) [missing anchor](b.md#three) [missing here](#beta)\n"
        "`[in code](nowhere.md)`\n"
        "```\n[in a block](nowhere.md)\n```\n"
        "[outside](../../etc/passwd)\n"
    )
    assert docs.broken_links(page, tmp_path) == [
        "docs/a.md:3: c.md: no such file",
        "docs/a.md:3: b.md#three: no heading or anchor #three there",
        "docs/a.md:3: #beta: no heading or anchor #beta there",
        "docs/a.md:8: ../../etc/passwd: points outside the repository",
    ]


def test_runnable_blocks_and_their_expected_exit() -> None:
    text = (
        "<!-- runnable -->\n```sh\n"
        ".venv/bin/python -m app check --as bob \\\n    --verb create   # denied (exit 1)\n"
        "label-rbac lint manifests/examples/tenants.yaml\n```\n"
        "```sh\npython -m app audit\n```\n"
    )
    runnable = [b for b in docs.blocks(text) if b.runnable]
    assert len(runnable) == 1
    commands = docs.runnable_commands(runnable[0])
    assert [(c.line, c.args, c.exit) for c in commands] == [
        (3, ("check", "--as", "bob", "--verb", "create"), 1),
        (5, ("lint", "manifests/examples/tenants.yaml"), 0),
    ]


@pytest.mark.parametrize(
    "line",
    [
        pytest.param("python -m app audit -o json | jq .", id="pipe"),
        pytest.param("python -m app lint $FILE", id="expansion"),
        pytest.param("kubectl get pods", id="not-the-cli"),
    ],
)
def test_runnable_commands_must_be_simple_calls_of_the_cli(line: str) -> None:
    with pytest.raises(ValueError):
        docs.runnable_commands(docs.Block(1, "sh", line, True))


def test_flags_are_read_next_to_commands() -> None:
    text = (
        "Run `python -m app check --bogus -n t1` or `kubectl label-rbac who-can --as x`; "
        "`label-rbac policy cache --stale` is a message.\n"
        "| `python -m app serve` | `--bind HOST:PORT`, `--nope` |\n"
        "```\n$ ./scripts/serve --bind 127.0.0.1:9443\npython -m app check: argument --nope\n"
        "python -m app audit -o json | jq --raw-output .\n```\n"
    )
    known = {"serve", "check", "who-can"}
    assert [(m.subcommand, m.flags) for m in docs.mentions(text, known)] == [
        ("serve", ("--bind",)),
        ("check", ("--bogus",)),
        ("who-can", ("--as",)),
        ("serve", ("--bind", "--nope")),
    ]
