"""Every TOML example in the README and the pages under docs/ is a settings fragment the agent
accepts, and names a strategy it can build: a copied example never fails at start."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from agent.app.standalone import build_strategy
from agent.model.settings import check_settings, merge_fragments, parse_fragment, settings_from

TOP = Path(__file__).resolve().parents[1]
BLOCK = re.compile(r"^( *)```toml\n(.*?)^\1```", re.M | re.S)


def examples() -> list[tuple[str, str]]:
    found = []
    for doc in (TOP / "README.md", *sorted((TOP / "docs").glob("*.md"))):
        for i, match in enumerate(BLOCK.finditer(doc.read_text())):
            text = "\n".join(line.removeprefix(match.group(1))
                             for line in match.group(2).splitlines())  # fmt: skip
            found.append((f"{doc.name}#{i}", text))
    return found


def test_the_docs_have_an_example_of_each_strategy() -> None:
    text = " ".join(body for _, body in examples())
    for strategy in ("immediate", "periodic", "fleet_lock"):
        assert f'strategy = "{strategy}"' in text


@pytest.mark.parametrize(("where", "text"), examples(), ids=[w for w, _ in examples()])
def test_example_parses_and_builds_its_strategy(where: str, text: str, tmp_path: Path) -> None:
    fragment = parse_fragment(text.encode(), where)
    settings = check_settings(settings_from(merge_fragments([(where, fragment)]), [where]))
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc/machine-id").write_text("3d1219c7b51a4c1e9b9b0e5d0c1f2a3b\n")
    strategy = build_strategy(settings, tmp_path)
    assert strategy.name == settings.strategy
