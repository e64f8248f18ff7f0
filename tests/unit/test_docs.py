"""Doc lines that contradicted the code or the repository (issue 29, finding 8), checked against both."""

from __future__ import annotations

import re

from datadistd.transport import TRANSPORTS
from tests.harness import ROOT

DOCS = [ROOT / "README.md", ROOT / "deploy" / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def test_the_socket_default_names_every_fallback_the_code_has() -> None:
    from datadistd.ops.config import default_socket_path

    row = next(line for line in (ROOT / "docs" / "operations.md").read_text().splitlines()
               if line.startswith("| `--socket PATH`"))
    for fallback in ("$RUNTIME_DIRECTORY/datadistd.sock", "/run/datadist/datadistd.sock",
                     "$XDG_RUNTIME_DIR/datadist/datadistd.sock", "/tmp/datadist-<uid>/datadistd.sock"):
        assert f"`{fallback}`" in row, fallback
    assert "/tmp/datadist-" in (default_socket_path.__doc__ or "")


def test_docs_cite_only_paths_inside_the_repository() -> None:
    """The spec is docs/spec.md; nothing points at the workspace outside the repository."""
    for doc in DOCS:
        assert "../shared/" not in doc.read_text(), doc


def test_no_doc_says_a_transport_that_exists_is_not_built() -> None:
    for doc in DOCS:
        for name in TRANSPORTS:
            assert not re.search(rf"\b{name}\b transport not built", doc.read_text(), re.I), (doc, name)


def test_the_ports_section_names_the_config_key_that_fixes_the_data_port() -> None:
    ops = (ROOT / "docs" / "operations.md").read_text()
    ports = ops[ops.index("## Ports"):ops.index("## Two hosts")]
    assert "`[transport] data_ports`" in ports and "data_ports = " in (ROOT / "deploy" / "datadistd.toml").read_text()
    assert "data_ports" in (ROOT / "deploy" / "README.md").read_text()


def test_docs_speak_of_the_code_not_of_tickets() -> None:
    """Docs describe the code as it is: no "issue N" ties a present-tense line to a ticket."""
    for doc in DOCS:
        for number, line in enumerate(doc.read_text().splitlines(), 1):
            assert not re.search(r"\bissues? \d", line, re.I), f"{doc}:{number}: {line.strip()}"


def test_the_docs_index_lists_every_page_and_the_readme_links_it() -> None:
    index = (ROOT / "docs" / "README.md").read_text()
    for page in sorted((ROOT / "docs").glob("*.md")):
        if page.name != "README.md":
            assert f"]({page.name})" in index, f"docs/README.md does not list {page.name}"
    first = (ROOT / "README.md").read_text().split("\n\n")[1]   # the paragraph under the title
    assert "(docs/spec.md)" in first and "(docs/README.md)" in first
    assert "host RAM" in first and "Ascend NPU memory" in first and "no GPU memory" in first


def test_the_daemon_map_names_every_module_in_short_cells() -> None:
    """docs/daemon.md's "Modules" map names every module of the daemon (a package's modules may be named in its
    row, ``transport/tcp/``), and no table cell of the page is over 200 characters: a map, not a notebook."""
    page = (ROOT / "docs" / "daemon.md").read_text()
    pieces = page[page.index("## Modules"):].split("\n## ")[0]
    package = ROOT / "server" / "datadistd"
    for path in sorted(package.rglob("*.py")):
        rel = path.relative_to(package)
        if rel.parent == rel.parent.parent or rel.name == "__main__.py":
            continue   # the package's own two files
        if rel.name == "__init__.py" and rel.parent.name not in ("links",):
            continue   # a room's doc is its docstring; LinkManager lives in links/__init__.py
        row = f"`{rel.parent.as_posix()}/`"
        named = f"`{rel.as_posix()}`" in pieces or (
            row in pieces and f"`{rel.stem}`" in pieces.split(row)[1].split("\n")[0])
        assert named, f"docs/daemon.md's map does not name {rel}"
    for number, line in enumerate(page.splitlines(), 1):
        if line.startswith("|"):
            longest = max(len(cell.strip()) for cell in line.strip().strip("|").split("|"))
            assert longest <= 200, f"docs/daemon.md:{number}: a cell of {longest} characters"
