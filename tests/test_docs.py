"""The docs: the site builds with warnings as errors, its generated reference covers the code,
and the README stays a short front page whose links and claims hold."""

from __future__ import annotations

import html
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
# Relative Markdown links: [text](target), not URLs and not in-page anchors.
LINK = re.compile(r"\]\(((?!https?://|mailto:|#)[^)\s]+)\)")


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The site as ``mkdocs build --strict`` makes it (a warning, a broken link or anchor fails it)."""
    out = tmp_path_factory.mktemp("site")
    env = os.environ | {
        # The generator imports edgekit: this checkout's, whatever the venv has installed.
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
        "NO_MKDOCS_2_WARNING": "1",
    }
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    log = done.stdout + done.stderr
    assert done.returncode == 0, log
    assert "WARNING" not in log, log
    return out


def page_text(site: Path, page: str) -> str:
    """A built page's text: tags dropped, entities read, runs of white space as one space."""
    markup = (site / page / "index.html").read_text(encoding="utf-8")
    return " ".join(html.unescape(re.sub(r"<[^>]+>", "", markup)).split())


def test_every_nav_page_is_built(site: Path) -> None:
    config = (REPO / "mkdocs.yml").read_text(encoding="utf-8")
    pages = re.findall(r"([\w/.-]+)\.md\s*$", config, flags=re.MULTILINE)
    assert len(pages) > 20
    for page in pages:
        built = site / ("" if page == "index" else page.removesuffix("/index")) / "index.html"
        assert built.is_file(), f"{page}.md is in the nav but was not built"


def test_the_cli_reference_has_every_command(site: Path) -> None:
    import typer.main
    from typer.core import TyperGroup

    from edgekit.cli import app

    root = typer.main.get_command(app)
    assert isinstance(root, TyperGroup)
    ctx = root.context_class(root, info_name="edgekit")
    text = page_text(site, "reference/cli")
    for name in root.list_commands(ctx):
        assert f"edgekit {name}" in text, name
    assert "edgekit deploy rollback" in text  # a subcommand of a group
    assert "--sign-key" in text  # options are there, not only names


def test_the_wire_reference_has_every_message_kind(site: Path) -> None:
    from edgekit.protocol.messages import KINDS

    markup = (site / "reference/wire/index.html").read_text(encoding="utf-8")
    for kind in KINDS:
        assert f'id="{kind}"' in markup, kind
    text = page_text(site, "reference/wire")
    assert "epoch" in text and "counters" in text  # fields of the telemetry message


def test_the_profile_reference_has_every_shipped_profile(site: Path) -> None:
    markup = (site / "reference/devices/index.html").read_text(encoding="utf-8")
    names = [
        path.stem for path in sorted((REPO / "devices").glob("*.toml"))
    ]  # a profile's name is its file's
    assert len(names) >= 10
    for name in names:
        assert f'id="{name}"' in markup, name


def test_the_python_api_is_rendered_from_docstrings(site: Path) -> None:
    from edgekit.model import load

    assert load.__doc__
    first_line = " ".join(load.__doc__.splitlines()[0].replace("``", "").split())
    assert first_line in page_text(site, "reference/python-api")


def test_the_api_page_shows_the_readme_s_python_example(site: Path) -> None:
    # Written once, in the README, between snippet markers; the site includes it.
    readme = README.read_text(encoding="utf-8")
    section = readme.split("--8<-- [start:python-api]", 1)[1].split("--8<-- [end:python-api]", 1)[0]
    lines = [line.strip() for line in section.splitlines()]
    code = [line for line in lines if line and not line.startswith(("```", "-->", "<!--"))]
    assert code
    text = page_text(site, "reference/python-api")
    for line in code[:3]:
        assert " ".join(line.split("#")[0].split()) in text, line


def test_the_readme_is_a_short_front_page() -> None:
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) < 150, f"README.md has {len(lines)} lines: move the detail into docs/"
    # The two set-up commands come first (tools/fresh_check.sh runs the first on a fresh machine).
    assert lines[2:6] == [
        "```bash",
        "tools/setup.sh && .venv/bin/edgekit demo",
        ".venv/bin/python -m pytest",
        "```",
    ]


@pytest.mark.parametrize("doc", ["README.md", "CONTRIBUTING.md", "CHANGELOG.md"])
def test_relative_links_point_at_files(doc: str) -> None:
    text = (REPO / doc).read_text(encoding="utf-8")
    targets = LINK.findall(text)
    for target in targets:
        path = (REPO / doc).parent / target.split("#", 1)[0]
        assert path.exists(), f"{doc} links to {target}, which does not exist"


def test_the_readme_names_only_markers_that_tests_carry() -> None:
    # The README once said hardware tests carried markers that no test used.
    claimed = set(re.findall(r"pytest -m (\w+)", README.read_text(encoding="utf-8")))
    assert claimed
    used = set()
    for path in (REPO / "tests").glob("*.py"):
        used |= set(re.findall(r"pytest\.mark\.(\w+)", path.read_text(encoding="utf-8")))
    assert claimed <= used, f"README names markers no test carries: {sorted(claimed - used)}"
