"""Every reference a user is given resolves inside the repository.

The README, ``docs/**/*.md``, ``benchmarks/README.md``, the READMEs under ``nodes/`` and
``topologies/``, every file of ``examples/`` and the docstrings of ``fedcore`` (and of the
scripts and benchmarks, whose docstrings are their ``--help``) are read for:

- markdown links ``[text](target)``: every one that is not a URL (``http:``, ``mailto:``
  ...) or an anchor of the same page must name a file or folder of the repository,
  relative to the file that holds it (``#anchor`` stripped);
- paths in backticks (``docs/results.md``, ````../something````) and bare paths with a
  file suffix (``reference/algorithms.md``) that name the repository: those that start
  with ``./`` or ``../``, whose first part is a top-level entry of the repository
  (``fedcore/``, ``tests/``, ``docs/`` ...), or that name a ``.md`` or ``.py`` file. Each
  must resolve, from the file's folder, the repository's root or the ``fedcore`` package
  (``cli/app.py`` in ``docs/architecture.md``), to something inside the repository;
  a glob (``scripts/*_results.py``) must match something. An output folder that
  ``.gitignore`` names (``benchmarks/results/``) counts as the repository's.

Across the README and the pages of the documentation site (``docs/*.md``), a link's
``#anchor`` must also name a heading of the page it points to (as MkDocs makes its ids), and
every ``--8<--`` include of a page (the site's home page includes the README's front part)
must name a file and, where given, a section of it that exists.

Paths of a run's or a user's files (``RUN_DIR/checkpoints/``, ``deploy/k8s/``, ``train/``)
are not the repository's and are left alone. And nothing may point into the workspace
beside the repository (``../shared/``, ``shared/reference``), which users do not have.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from functools import cache
from itertools import pairwise
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

MD_LINK = re.compile(r"!?\[[^\]\n]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
"""A markdown link or image: its target (a title after it left out)."""
TICKS = re.compile(r"(`+)(.+?)\1", re.S)
"""A backticked span (single or double backticks: markdown and reStructuredText)."""
URL = re.compile(r"\b[a-z][a-z0-9+.-]*://[^\s)`>\"']+", re.IGNORECASE)
PATHLIKE = re.compile(r"^(?:\.{1,2}/)*[\w.*-]+(?:/[\w.*-]+)*/?$")
"""What a path of the repository can look like: no spaces, ``<placeholders>`` or ``~``."""
BARE = re.compile(
    r"(?<![\w./@:~<>$-])((?:\.{1,2}/)*(?:[\w-][\w.-]*/)+[\w-][\w.-]*"
    r"\.(?:md|py|toml|json|txt|ya?ml|proto|png|csv|sh))\b(?!/)"
)
"""A bare path with a folder and a file suffix (``reference/algorithms.md``)."""
FORBIDDEN = re.compile(r"shared/reference|\.\./shared/|/work/shared", re.IGNORECASE)
"""Where the repository's authors' workspace is, which users do not have."""
SCHEME = re.compile(r"^[a-z][a-z0-9+.-]*:", re.IGNORECASE)


def scope_files() -> list[Path]:
    """The user-facing text files: READMEs, docs, examples (whole files)."""
    files = [ROOT / "README.md", ROOT / "benchmarks" / "README.md"]
    files += sorted((ROOT / "docs").rglob("*.md"))
    for folder in ("nodes", "topologies"):
        files += sorted((ROOT / folder).rglob("README.md"))
    files += sorted(
        p
        for p in (ROOT / "examples").rglob("*")
        if p.is_file()
        and "__pycache__" not in p.parts
        and p.suffix in (".py", ".toml", ".md", ".txt")
    )
    return files


def docstring_modules() -> list[Path]:
    """Python files whose docstrings users read: fedcore's, the scripts' and benchmarks'."""
    return [
        p
        for folder in ("fedcore", "scripts", "benchmarks")
        for p in sorted((ROOT / folder).rglob("*.py"))
        if "__pycache__" not in p.parts
    ]


def docstrings(source: str) -> Iterator[str]:
    """Every docstring of a module: the module's, classes', functions', and the string
    right after an assignment (an attribute's docstring)."""
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            text = ast.get_docstring(node, clean=False)
            if text:
                yield text
        body = getattr(node, "body", None)
        if isinstance(body, list):
            for first, second in pairwise(body):
                if (
                    isinstance(first, ast.Assign | ast.AnnAssign)
                    and isinstance(second, ast.Expr)
                    and isinstance(second.value, ast.Constant)
                    and isinstance(second.value.value, str)
                ):
                    yield second.value.value


def references(text: str) -> Iterator[tuple[str, str]]:
    """``(kind, target)`` of every markdown link (``link``) and every path-looking
    backticked span (``tick``) or bare path (``bare``) in ``text``; URLs left out."""
    for match in MD_LINK.finditer(text):
        target = match.group(1)
        if not SCHEME.match(target) and not target.startswith("#"):
            yield "link", target
    rest = MD_LINK.sub(" ", URL.sub(" ", text))
    for match in TICKS.finditer(rest):
        span = match.group(2).strip()
        if "/" in span and PATHLIKE.match(span):
            yield "tick", span
    for match in BARE.finditer(TICKS.sub(" ", rest)):
        yield "bare", match.group(1)


@cache
def top_level() -> frozenset[str]:
    """The repository's top-level entries (folders and files), as a path's first part."""
    return frozenset(p.name for p in ROOT.iterdir() if not p.name.startswith("."))


@cache
def ignored_outputs() -> tuple[str, ...]:
    """The folders ``.gitignore`` names by a path (``benchmarks/results/``): where the
    scripts write, named in the docs though not committed."""
    path = ROOT / ".gitignore"
    lines = path.read_text(encoding="utf-8").splitlines() if path.is_file() else []
    return tuple(
        line.strip().lstrip("/")
        for line in lines
        if line.strip().endswith("/")
        and "/" in line.strip().strip("/")
        and not any(c in line for c in "*?[!")
    )


def names_the_repository(kind: str, target: str) -> bool:
    """Whether a reference is to the repository's files (not a run's or a user's)."""
    if kind == "link" or target.startswith(("./", "../")):
        return True
    first = target.split("/", 1)[0]
    return first in top_level() or target.endswith((".md", ".py"))


def resolves(holder: Path, target: str) -> bool:
    """Whether ``target`` (anchor stripped) names something inside the repository, from
    ``holder``'s folder, the root or the ``fedcore`` package."""
    path = target.split("#", 1)[0]
    if not path:
        return True
    root = ROOT.resolve()
    for base in (holder.parent, ROOT, ROOT / "fedcore"):
        if any(c in path for c in "*?["):
            found = list(base.glob(path.rstrip("/")))
        else:
            found = [base / path, base / f"{path}.py"]  # a module without its suffix
        for candidate in found:
            real = candidate.resolve()
            if (real == root or root in real.parents) and real.exists():
                return True
        inside = (base / path).resolve()
        rel = inside.relative_to(root).as_posix() + "/" if root in inside.parents else ""
        if rel and any(rel.startswith(out) for out in ignored_outputs()):
            return True
    return False


def texts() -> Iterator[tuple[Path, str]]:
    """Every text in scope, with the file it is in."""
    for path in scope_files():
        yield path, path.read_text(encoding="utf-8")
    for path in docstring_modules():
        for text in docstrings(path.read_text(encoding="utf-8")):
            yield path, text


def broken() -> tuple[list[str], int]:
    """The references that do not resolve (``file: kind target``), and how many were
    checked."""
    bad: list[str] = []
    checked = 0
    for path, text in texts():
        for kind, target in references(text):
            if not names_the_repository(kind, target):
                continue
            checked += 1
            if not resolves(path, target):
                bad.append(f"{path.relative_to(ROOT)}: {kind} {target}")
    return sorted(set(bad)), checked


def test_every_reference_resolves_inside_the_repository() -> None:
    bad, checked = broken()
    assert checked > 200, checked  # the scan found the references it should
    assert not bad, "references that do not resolve inside the repository:\n" + "\n".join(bad)


def test_nothing_points_into_the_workspace_beside_the_repository() -> None:
    files = [*scope_files(), *docstring_modules()]
    assert len(files) > 100, len(files)
    found = [
        f"{path.relative_to(ROOT)}:{lineno}: {line.strip()}"
        for path in files
        for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if FORBIDDEN.search(line)
    ]
    assert not found, "\n".join(found)


def test_the_scope_holds_every_kind_of_user_facing_text() -> None:
    names = {p.relative_to(ROOT).as_posix() for p in scope_files()}
    for expected in (
        "README.md",
        "docs/architecture.md",
        "docs/results.md",
        "docs/config.md",
        "docs/index.md",
        "benchmarks/README.md",
        "nodes/README.md",
        "topologies/README.md",
        "examples/dpsgd.toml",
        "examples/user_algorithm/momentum_gossip.py",
    ):
        assert expected in names, expected
    modules = {p.relative_to(ROOT).as_posix() for p in docstring_modules()}
    assert {"fedcore/algorithms/optim.py", "scripts/large_batch_results.py"} <= modules


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        # links: relative to the file; anchors stripped; URLs and same-page anchors skipped
        ("see [results](docs/results.md#large-batches)", []),
        ("see [it](docs/nope.md)", ["link docs/nope.md"]),
        ("[site](https://example.org/a/b.md) [top](#config) [m](mailto:x@y.z)", []),
        ("![curves](docs/results/missing.png)", ["link docs/results/missing.png"]),
        # backticked paths naming the repository
        (
            "``../shared/reference/algorithms.md`` section 11",
            ["tick ../shared/reference/algorithms.md"],
        ),
        ("`fedcore/plotting/figure.py` and `scripts/*_results.py`", []),
        ("`fedcore/nope.py`", ["tick fedcore/nope.py"]),
        ("`cli/app.py` (in the package)", []),
        ("`fedcore/__init__` names them", []),
        ("writes `benchmarks/results/engines.json` (git-ignored)", []),
        ("`../../outside/x.md`", ["tick ../../outside/x.md"]),
        # bare paths with a suffix
        ("the bug named in reference/algorithms.md sections 5.1", ["bare reference/algorithms.md"]),
        ("see https://github.com/o/r/blob/main/reference/x.md", []),
        # a run's or a user's paths are not the repository's
        ("`RUN_DIR/checkpoints/`, `deploy/k8s/`, `runs/<name>-<t>`, `train/`, `1/n`", []),
    ],
)
def test_the_checker(text: str, expected: list[str]) -> None:
    holder = ROOT / "README.md"
    found = [
        f"{kind} {target}"
        for kind, target in references(text)
        if names_the_repository(kind, target) and not resolves(holder, target)
    ]
    assert found == expected


# --- anchors and includes across the README and the site's pages -------------------------

SNIPPET = re.compile(r'^--8<-- "([^":]+)(?::([^"]*))?"\s*$', re.M)
"""A pymdownx.snippets include: the file, then a section name or a line range."""
HEADING = re.compile(r"^#{1,6} (.+?)\s*$")


def site_pages() -> list[Path]:
    """The README and the site's pages (``docs/*.md``)."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def expanded(path: Path) -> str:
    """A page's text with its includes in place (whole files: a superset of the headings)."""
    text = path.read_text(encoding="utf-8")
    return SNIPPET.sub(lambda m: (ROOT / m.group(1)).read_text(encoding="utf-8"), text)


def slug(title: str) -> str:
    """The id MkDocs (Python-Markdown's toc) gives a heading: markup left out, lower case,
    punctuation dropped, spaces and hyphens as one hyphen."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", title).replace("`", "").replace("*", "")
    text = re.sub(r"[^\w\s-]", "", text).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def anchors(path: Path) -> set[str]:
    """The ids of a page's headings (fenced code left out; a repeated id gets ``_1`` ...)."""
    found: set[str] = set()
    fence = False
    for line in expanded(path).splitlines():
        if line.lstrip().startswith("```"):
            fence = not fence
            continue
        match = None if fence else HEADING.match(line)
        if match:
            base = slug(match.group(1))
            name, n = base, 0
            while name in found:
                n += 1
                name = f"{base}_{n}"
            found.add(name)
    return found


def test_every_anchor_across_the_pages_names_a_heading() -> None:
    pages = {p.resolve() for p in site_pages()}
    bad, checked = [], 0
    for holder in site_pages():
        text = holder.read_text(encoding="utf-8")
        for match in MD_LINK.finditer(text):
            target = match.group(1)
            if SCHEME.match(target) or "#" not in target:
                continue
            file, _, anchor = target.partition("#")
            page = (holder.parent / file).resolve() if file else holder.resolve()
            if page not in pages:
                continue
            checked += 1
            if anchor not in anchors(page):
                bad.append(f"{holder.relative_to(ROOT)}: {target}")
    assert checked >= 5, checked
    assert not bad, "links to headings that do not exist:\n" + "\n".join(bad)


def test_every_include_names_a_file_and_its_section() -> None:
    found = 0
    for holder in site_pages():
        for match in SNIPPET.finditer(holder.read_text(encoding="utf-8")):
            found += 1
            file, part = match.group(1), match.group(2) or ""
            source = ROOT / file
            assert source.is_file(), f"{holder.relative_to(ROOT)} includes {file}: no such file"
            if part and not part[0].isdigit():
                text = source.read_text(encoding="utf-8")
                for edge in ("start", "end"):
                    assert f"--8<-- [{edge}:{part}]" in text, (holder.name, file, part, edge)
    assert found >= 2, found


def test_the_slugs_are_mkdocs_ids() -> None:
    assert slug("Thousands of peers: the vectorized engine") == (
        "thousands-of-peers-the-vectorized-engine"
    )
    assert slug("`engines.py`: the vectorized engine against the message engine") == (
        "enginespy-the-vectorized-engine-against-the-message-engine"
    )
    assert slug("Failures, Ctrl-C and `--resume`") == "failures-ctrl-c-and-resume"


# --- docs/architecture.md: the layer table, the flow and the layout name real modules -------

ARCHITECTURE = ROOT / "docs" / "architecture.md"
PKG = ROOT / "fedcore"
IDENTIFIER = re.compile(r"^[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*$")
"""A backticked name in the table: a module, or a name defined in one (``lazy.lazy_names``)."""
DATA_FILES = (".csv", ".json", ".jsonl", ".toml", ".png")
FLOW_STEP = re.compile(r"^\s*(?:-> )?([a-z_]+(?:/[a-z_]+)+)(?:\.(\w+))?(?:\s|$)")
"""A step of the flow diagram: a module path under ``fedcore/`` (``setup/plan``), and the
name called in it (``outline_run``)."""


def _section(title: str) -> str:
    text = ARCHITECTURE.read_text(encoding="utf-8")
    start = text.index(f"\n## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end >= 0 else len(text)]


def _module(base: Path, dotted: str) -> Path | None:
    """The file or package of module ``dotted`` (``a.b``, ``a/b``) under ``base``."""
    path = base.joinpath(*re.split(r"[./]", dotted.strip("/")))
    if path.with_suffix(".py").is_file():
        return path.with_suffix(".py")
    if (path / "__init__.py").is_file():
        return path
    return None


def _files(module: Path) -> list[Path]:
    """The Python files of a module (a package: all of its files)."""
    return sorted(module.rglob("*.py")) if module.is_dir() else [module]


@cache
def _defined(path: Path) -> frozenset[str]:
    """The names a file defines or imports at its top, and its classes' members."""
    names: set[str] = set()
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        if isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef):
                    names.add(item.name)
                elif isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                    names.add(item.target.id)
                elif isinstance(item, ast.Assign):
                    names.update(t.id for t in item.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        elif isinstance(node, ast.Import | ast.ImportFrom):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
    return frozenset(names)


def _names_in(module: Path) -> set[str]:
    return {name for path in _files(module) for name in _defined(path)}


def _layer_rows() -> list[tuple[int, list[str], list[str]]]:
    """``(layer, folder-or-module spans, its-job spans)`` of each row of the layer table."""
    rows = []
    for line in _section("The folders, bottom to top").splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 3 or not cells[0].isdigit():
            continue
        spans = [[m.group(2).strip() for m in TICKS.finditer(cell)] for cell in cells[1:]]
        rows.append((int(cells[0]), spans[0], spans[1]))
    return rows


def _resolve_in_row(span: str, bases: list[Path], modules: list[Path]) -> bool:
    """Whether a backticked name of a row's job names a module of the row's folders, a
    module of ``fedcore`` (with a name defined in it, ``lazy.lazy_names``), or a name defined
    in one of the row's modules."""
    if "/" in span or span.endswith(".py"):
        module = span.removesuffix(".py")
        return resolves(ARCHITECTURE, span) or any(_module(b, module) for b in [*bases, PKG])
    first, *rest = span.split(".")
    for base in [*bases, PKG]:
        module = _module(base, first)
        if module is not None and _holds(module, rest):
            return True
    return not rest and any(first in _names_in(m) for m in modules)


def _holds(module: Path, rest: list[str]) -> bool:
    """Whether ``module.a.b`` (``rest``: ``["a", "b"]``) is a submodule of ``module`` or a
    name defined in one."""
    for i, part in enumerate(rest):
        sub = _module(module, part) if module.is_dir() else None
        if sub is None:
            return part in _names_in(module) and i >= len(rest) - 2
        module = sub
    return True


def test_the_architecture_layer_table_names_every_module_at_its_layer() -> None:
    import tests.test_layering as layering

    rows = _layer_rows()
    assert len(rows) >= 15, rows
    bad: list[str] = []
    tabled: set[str] = set()
    for layer, folders, _ in rows:
        for name in folders:
            top = name.rstrip("/")
            tabled.add(top)
            if _module(PKG, top) is None:
                bad.append(f"`{name}`: no fedcore/{top}.py or fedcore/{top}/")
            elif (name.endswith("/")) != (PKG / top).is_dir():
                bad.append(f"`{name}`: a {'package' if (PKG / top).is_dir() else 'module'}")
            if layering.LAYERS.get(top) != layer:
                bad.append(
                    f"`{name}` at layer {layer}; tests/test_layering.py says "
                    f"{layering.LAYERS.get(top)}"
                )
    untabled = set(layering.LAYERS) - tabled - {"__init__", "__main__"}
    bad += [f"`{name}` (fedcore's) is in no row" for name in sorted(untabled)]
    assert not bad, "docs/architecture.md's layer table:\n" + "\n".join(bad)


def test_the_architecture_layer_table_names_what_exists() -> None:
    """Every backticked name in a row's job is a module of the row's folders or a name one
    of them defines (``RunObserver``, ``lazy.lazy_names``): a module that moved, or a name
    that was renamed, fails here until the table says where it is now."""
    bad: list[str] = []
    checked = 0
    for _, folders, job in _layer_rows():
        bases = [PKG / f.rstrip("/") for f in folders if f.endswith("/")]
        modules = [m for f in folders if (m := _module(PKG, f.rstrip("/")))]
        named = [m for s in job if "/" in s and (m := _module(PKG, s.removesuffix(".py")))]
        for span in job:
            if not (IDENTIFIER.match(span) or ("/" in span and PATHLIKE.match(span))):
                continue  # `[time]`, `B = 1`, `launch --resume`, `python -m ...`
            if span.endswith(DATA_FILES):
                continue  # a run's files: `results.csv`, `rounds.csv`
            checked += 1
            if not _resolve_in_row(span, bases, [*modules, *named]):
                bad.append(f"`{span}` (row of {', '.join(folders)})")
    assert checked > 50, checked
    assert not bad, "docs/architecture.md's layer table names what is not there:\n" + "\n".join(bad)


def test_the_architecture_flow_names_modules_and_their_functions() -> None:
    flow = _section("From a config to a run")
    bad: list[str] = []
    steps = 0
    for line in flow.splitlines():
        match = FLOW_STEP.match(line)
        if not match:
            continue
        steps += 1
        path, name = match.groups()
        module = _module(PKG, path)
        if module is None:
            bad.append(f"{path}: no such module")
        elif name and name not in _names_in(module):
            bad.append(f"{path}.{name}: {path} defines no {name}")
    assert steps >= 6, steps
    assert not bad, "docs/architecture.md's flow:\n" + "\n".join(bad)


def test_the_architecture_layout_names_every_module() -> None:
    """The left column of the Layout's ``fedcore/`` lines names modules that exist, and every
    module of ``fedcore`` is there."""
    block = _section("Layout").split("```")[1]
    lines = block.split("\nfedcore/", 1)[1].split("\ntopologies/", 1)[0].splitlines()[1:]
    listed: set[str] = set()
    for line in lines:
        left = re.split(r"\s{2,}", line.strip())[0] if line.startswith("  ") else ""
        if line.startswith(" " * 20):
            continue  # the description column
        for name in filter(None, (n.strip() for n in left.split(","))):
            listed.add(name.rstrip("/"))
            assert _module(PKG, name.rstrip("/")), f"Layout: fedcore/{name} does not exist"
    present = {
        p.name.removesuffix(".py")
        for p in PKG.iterdir()
        if (p.suffix == ".py" or (p / "__init__.py").is_file())
        and p.name not in ("__init__.py", "__main__.py", "proto")
    }
    assert present - listed == set(), f"Layout misses {sorted(present - listed)}"
