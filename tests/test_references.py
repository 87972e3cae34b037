"""Every file, folder and page the repository names is in the repository: relative links in
Markdown, repository paths (`agent/host/bootc.py`, `docs/operate.md`), module paths relative
to the naming file's folder or to one above it (as a module names another of its package),
and every `*.md`, in the docs, Python comments and docstrings, unit
files, manifests, Containerfiles and scripts. A reader of the repository has nothing else:
material from outside is cited by URL (and commit), never by a path. (A string in Python code
is data, a file name on a host for instance, not a reference.)"""

from __future__ import annotations

import ast
import io
import re
import subprocess
import tokenize
from functools import cache
from pathlib import Path, PurePosixPath

import pytest

REPO = Path(__file__).resolve().parents[1]
TOP = ("agent", "standins", "tests", "docs", "deploy", "systemd", "containerfiles", "vm-tests",
       "bench", ".ci")  # fmt: skip
# Inputs supplied from outside, as the peer binaries are: the conformance kit beside the
# repository (tests/conformance/README.md says what it holds); and files of the packages the
# agent depends on, named with their package.
OUTSIDE_INPUTS = ("../shared/kit", "kubernetes_asyncio/")
# tests/fixtures/: data as the real controller rendered it, not the project's words.
SKIP = ("tests/fixtures/",)
TEXT_SUFFIXES = {".md", ".py", ".sh", ".toml", ".yaml", ".yml", ".service", ".timer",
                 ".target", ".conf", ".txt", ".cfg", ".json", ""}  # fmt: skip

_EDGE = r"(?<![\w./:@$~{-])"
# A Markdown link's target: [text](target)
_LINK = re.compile(r"\]\(([^)\s]+)\)")
# A path from the repository's top, or one relative to the naming file, ending in a name
# with a suffix the repository's files have.
_TOP_PATH = re.compile(_EDGE + r"((?:" + "|".join(re.escape(t) for t in TOP) + r")/[\w./*-]*)")
# (not a call: `m.sh(...)` is a method)
_FILE_NAME = re.compile(_EDGE + r"((?:\.\./|\./)*[\w-]+(?:/[\w.-]+)*\.(?:md|py|sh))\b(?!\()")


@cache
def tracked() -> tuple[str, ...]:
    out = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=REPO,
                         capture_output=True, text=True, check=True).stdout  # fmt: skip
    return tuple(line for line in out.splitlines() if (REPO / line).is_file())


def scanned() -> list[str]:
    return [path for path in tracked()
            if not path.startswith(SKIP) and PurePosixPath(path).suffix in TEXT_SUFFIXES
            and not path.endswith(".png")]  # fmt: skip


def resolves(name: str, where: str) -> bool:
    """`name` as the file at `where` means it: from the file's folder or any folder above it
    (a module path from its package), or from the repository's top."""
    name = name.split("#")[0].rstrip(".,:;")
    if not name or any(ch in name for ch in "*?<>{}$"):
        return True  # a pattern or a placeholder, not a name
    if name.startswith(OUTSIDE_INPUTS):
        return True
    folder = (REPO / where).parent
    for base in (folder, *folder.parents):
        candidate = (base / name).resolve()
        if candidate.exists() and (candidate == REPO or REPO in candidate.parents):
            return True
        if base == REPO:
            break
    return False


def names_in(text: str, path: str) -> list[tuple[int, str]]:
    found: list[tuple[int, str]] = []
    for number, line in enumerate(text.splitlines(), 1):
        candidates = set()
        if path.endswith(".md"):
            for target in _LINK.findall(line):
                if not re.match(r"[a-z][a-z+.-]*:|#|mailto:", target):
                    candidates.add(target)
        candidates.update(_TOP_PATH.findall(line))
        candidates.update(_FILE_NAME.findall(line))
        found += [(number, name) for name in sorted(candidates)]
    return found


def prose_of(text: str) -> str:
    """A Python source's comments and docstrings, each on its own line number; the rest
    blank."""
    lines = text.splitlines()
    kept = [""] * len(lines)
    scopes = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, scopes) and node.body:
            first = node.body[0]
            if (
                isinstance(first, ast.Expr)
                and isinstance(first.value, ast.Constant)
                and (isinstance(first.value.value, str))
            ):
                for number in range(first.lineno - 1, first.end_lineno or first.lineno):
                    kept[number] = lines[number]
    for token in tokenize.generate_tokens(io.StringIO(text).readline):
        if token.type == tokenize.COMMENT:
            kept[token.start[0] - 1] += " " + token.string
    return "\n".join(kept)


def is_python(path: str, text: str) -> bool:
    first_line = text.split("\n", 1)[0]
    script = not PurePosixPath(path).suffix and first_line.startswith("#!")
    return path.endswith(".py") or (script and "python" in first_line)


def dangling() -> list[str]:
    wrong = []
    for path in scanned():
        try:
            text = (REPO / path).read_text()
        except UnicodeDecodeError:
            continue
        if is_python(path, text):
            text = prose_of(text)
        wrong += [f"{path}:{number}: {name}" for number, name in names_in(text, path)
                  if not resolves(name, path)]  # fmt: skip
    return wrong


def test_every_named_path_is_in_the_repository() -> None:
    wrong = dangling()
    assert not wrong, f"{len(wrong)} named paths do not resolve:\n" + "\n".join(wrong)


def test_python_code_is_read_for_its_comments_and_docstrings_only() -> None:
    source = ('"""See docs/nowhere.md."""\n\nNAME = "run.sh"  # and README.md\n\n\n'
              'def f() -> None:\n    """host/simulated.py"""\n')  # fmt: skip
    prose = prose_of(source)
    assert prose.splitlines()[0] == '"""See docs/nowhere.md."""'
    assert "run.sh" not in prose and "# and README.md" in prose.splitlines()[2]
    assert "host/simulated.py" in prose.splitlines()[6]


@pytest.mark.parametrize(
    ("line", "where", "ok"),
    [
        ("see [the guide](docs/nowhere.md)", "README.md", False),
        ("(agent/host/ports.py holds the ports)", "README.md", True),
        ("model/bootc_caps.py says", "agent/cluster/prestager.py", True),
        ("host/simulated.py says", "agent/cluster/prestager.py", False),
        ("DESIGN.md §4", "agent/update/engine.py", False),
        ("../beside-the-repository.md", "tests/README.md", False),  # outside the repository
        (
            "https://github.com/openshift/machine-config-operator/blob/abc/docs/README.md",
            "x.md",
            True,
        ),
        ("tests/test_*.py and $STATE/foo.py", "README.md", True),
        ("out = m.sh(command)", "tests/system/drift_scenarios.py", True),
    ],
)
def test_the_checker_tells_names_that_resolve(line: str, where: str, ok: bool) -> None:
    names = [name for _, name in names_in(line, where)]
    assert names or ok, f"no name found in {line!r}"
    assert all(resolves(name, where) for name in names) is ok, names
