#!/usr/bin/env python3
"""No import circle inside any crate or among the scripts (issue 27).

Draws the import graph at file level and reports every strongly connected component of two or
more files, that is every set of files that reach each other through imports:

- Rust: each crate's `src/` tree, from its roots (`lib.rs`, `main.rs`) along `mod NAME;` lines.
  A file imports another when it names a path into it: in a `use` (nested trees expanded) or
  written out in code, starting at `crate::`, `super::`, `self::` or at a child module declared
  in the file. The path goes to the file of its longest prefix that is a module; a `pub use` is
  itself an import of the file it names. `mod NAME;` alone is not an import: it places a file,
  it does not use it. `super::` inside an inline `mod tests { … }` is resolved from that inline
  module, so a file's own tests do not point at its parent.
  A file reading a module that holds it (its `mod.rs`, the crate root's re-exports) is not
  counted: a folder's `mod.rs` keeps the types its backends share and dispatches to them, as
  every `ops/<op>/` does, and that is the inside of one module, not a circle between two. So
  the circles found are between files neither of which holds the other (the seven of the
  2026-11 architecture review, §1.2).
- Python: the `*.py` files of each folder under `scripts/` import each other by module name
  (the folder is `sys.path[0]` when a script runs), lazy imports inside functions included.

Known circles that are being removed are listed in the allow-list (default
`scripts/import-circles-allowed.txt`), one a line, `owner: file file …`. The check fails on a
circle not listed, and on a listed circle that no longer exists, so the list can only shrink.

    python3 scripts/check-import-circles.py [--root DIR] [--allow FILE] [--verbose]

Exit status: 0 clean, 1 a circle not allowed or a stale allow-list entry, 2 bad input.
"""

from __future__ import annotations

import argparse
import ast
import os
import re
import sys
from pathlib import Path
from typing import NoReturn

# Comments, string and char literals are blanked before braces and paths are read, so a `{`
# in a format string or a path in a doc comment counts for nothing. Lifetimes ('a) are not
# char literals: the pattern needs the closing quote.
RUST_NOISE = re.compile(
    r"""//[^\n]*"""
    r"""|/\*(?:[^*]|\*(?!/))*\*/"""
    r"""|b?r(\#*)"(?:.|\n)*?"\1"""
    r"""|b?"(?:\\[\s\S]|[^"\\])*\""""
    r"""|b?'(?:\\u\{[0-9a-fA-F]+\}|\\.|[^\\'\n])'""",
)
MOD_DECL = re.compile(r"\b(?:pub(?:\s*\([^)]*\))?\s+)?mod\s+(r#)?(\w+)\s*([;{])")
# `#[path = "file.rs"]` before a `mod NAME;` (other attributes may stand between them).
PATH_ATTR = re.compile(r'#\[path\s*=\s*"([^"]+)"\]\s*(?:#\[[^\]]*\]\s*)*$')
USE_STMT = re.compile(r"\buse\s+([^;]*);")
PATH = re.compile(r"(?<![\w:$])((?:\w+::)+\w+|(?:\w+::)+\{|(?:\w+::)+\*)")


def bad_input(message: str) -> NoReturn:
    """One line on stderr, exit status 2."""
    print(message, file=sys.stderr)
    sys.exit(2)


def blank_noise(text: str) -> str:
    """The text with comments and literals replaced by spaces (newlines kept)."""
    return RUST_NOISE.sub(lambda m: re.sub(r"[^\n]", " ", m.group(0)), text)


def expand_use_tree(tree: str) -> list[list[str]]:
    """`a::{b, c::{self, d}}` -> [[a, b], [a, c], [a, c, d]] (globs and `as` names dropped)."""
    tree = re.sub(r"\s+", "", re.sub(r"\s+as\s+\w+", "", tree))

    def parse(s: str, i: int, prefix: list[str]) -> tuple[list[list[str]], int]:
        out: list[list[str]] = []
        segs = list(prefix)
        word = ""
        while i < len(s):
            ch = s[i]
            if ch == "{":
                inner, i = parse_list(s, i + 1, segs)
                out.extend(inner)
                return out, i
            if ch in ",}":
                break
            if s.startswith("::", i):
                segs.append(word)
                word = ""
                i += 2
                continue
            word += ch
            i += 1
        if word == "self":
            out.append(segs)
        elif word and word != "*":
            out.append(segs + [word])
        elif word == "*":
            out.append(segs)
        return out, i

    def parse_list(s: str, i: int, prefix: list[str]) -> tuple[list[list[str]], int]:
        out: list[list[str]] = []
        while i < len(s) and s[i] != "}":
            items, i = parse(s, i, prefix)
            out.extend(items)
            if i < len(s) and s[i] == ",":
                i += 1
        return out, i + 1

    paths, _ = parse(tree, 0, [])
    return [[seg.removeprefix("r#") for seg in p] for p in paths if p]


class RustCrate:
    """One crate root's module tree: module path (tuple of names) -> file, inline modules
    mapped to the file that holds them."""

    def __init__(self, root_file: Path):
        self.modules: dict[tuple[str, ...], Path] = {}
        # file -> [(module path of the code at that position, code start, code end)]
        self.scopes: dict[Path, list[tuple[tuple[str, ...], int, int]]] = {}
        self.code: dict[Path, str] = {}
        self._place(root_file, (), root_file.parent)

    def _place(self, file: Path, module: tuple[str, ...], child_dir: Path) -> None:
        if file in self.code:
            bad_input(f"error: {file} is reached twice through mod lines")
        raw = file.read_text(encoding="utf-8")
        code = blank_noise(raw)
        self.code[file] = code
        self.modules[module] = file
        scopes = [(module, 0, len(code))]
        # Inline `mod x { … }` blocks: find each one's closing brace by depth.
        for m in MOD_DECL.finditer(code):
            name = m.group(2)
            outer = self._scope_at(scopes, m.start())
            # `mod y;` inside an inline `mod x { … }` of foo.rs lives in foo/x/y.rs.
            folder = child_dir.joinpath(*outer[len(module) :])
            attr = PATH_ATTR.search(raw, max(0, m.start() - 300), m.start())
            if m.group(3) == ";" and attr:
                # A `#[path]` file: named from this file's folder, its children beside it.
                if outer != module:
                    bad_input(f"error: {file}: `#[path]` on `mod {name};` inside an inline module is not read")
                target = Path(os.path.normpath(file.parent / attr.group(1)))
                if not target.is_file():
                    bad_input(f"error: {file}: `mod {name};` has no file {target} (its #[path])")
                self._place(target, outer + (name,), target.parent)
            elif m.group(3) == ";":
                target = self._child_file(folder, name, file)
                # foo/mod.rs keeps its children beside it; foo.rs keeps them in foo/.
                target_children = target.parent if target.name == "mod.rs" else target.with_suffix("")
                self._place(target, outer + (name,), target_children)
            else:
                end = self._closing_brace(code, m.end() - 1, file)
                self.modules[outer + (name,)] = file
                scopes.append((outer + (name,), m.end(), end))
        self.scopes[file] = scopes

    @staticmethod
    def _scope_at(scopes: list[tuple[tuple[str, ...], int, int]], pos: int) -> tuple[str, ...]:
        """The innermost module whose code holds `pos`."""
        best = scopes[0]
        for scope in scopes[1:]:
            if scope[1] <= pos < scope[2] and len(scope[0]) > len(best[0]):
                best = scope
        return best[0]

    @staticmethod
    def _closing_brace(code: str, open_at: int, file: Path) -> int:
        depth = 0
        for i in range(open_at, len(code)):
            if code[i] == "{":
                depth += 1
            elif code[i] == "}":
                depth -= 1
                if depth == 0:
                    return i
        bad_input(f"error: {file}: unbalanced braces after offset {open_at}")

    @staticmethod
    def _child_file(folder: Path, name: str, parent: Path) -> Path:
        for candidate in (folder / f"{name}.rs", folder / name / "mod.rs"):
            if candidate.is_file():
                return candidate
        bad_input(f"error: {parent}: `mod {name};` has no file {folder / name}.rs or {folder / name}/mod.rs")

    def edges(self) -> dict[Path, set[Path]]:
        graph: dict[Path, set[Path]] = {f: set() for f in self.code}
        for file, code in self.code.items():
            for path, pos in self._paths(code):
                module = self._scope_at(self.scopes[file], pos)
                target = self._resolve(module, path)
                if target is not None and target not in self._ancestors(file):
                    graph[file].add(target)
        return graph

    def _ancestors(self, file: Path) -> set[Path]:
        """The file itself and the files of the modules that hold it, up to the crate root."""
        module = next(m for m, f in self.modules.items() if f == file)
        return {self.modules[module[:cut]] for cut in range(len(module) + 1)}

    @staticmethod
    def _paths(code: str):
        """Every path the code names, with where it stands: `use` trees expanded, the rest as
        written (`a::b::c(…)`, `a::B { … }`)."""
        used_spans = []
        for m in USE_STMT.finditer(code):
            used_spans.append((m.start(), m.end()))
            for path in expand_use_tree(m.group(1)):
                yield path, m.start()
        for m in PATH.finditer(code):
            if any(a <= m.start() < b for a, b in used_spans):
                continue
            segs = [s for s in m.group(1).split("::") if s and s not in "{*"]
            yield segs, m.start()

    def _resolve(self, module: tuple[str, ...], path: list[str]) -> Path | None:
        """The file a path from `module` lands in, or None for another crate's path."""
        head, rest = path[0], path[1:]
        if head == "crate":
            base: tuple[str, ...] = ()
        elif head in ("super", "self"):
            base = module
            while path and path[0] in ("super", "self"):
                if path[0] == "super":
                    if not base:
                        return None
                    base = base[:-1]
                path = path[1:]
            rest = path
        elif module + (head,) in self.modules:
            base, rest = module + (head,), rest
        else:
            return None
        full = base + tuple(rest)
        for cut in range(len(full), -1, -1):
            if full[:cut] in self.modules:
                return self.modules[full[:cut]]
        return None


def rust_graph(repo: Path) -> dict[Path, set[Path]]:
    graph: dict[Path, set[Path]] = {}
    for src in sorted(repo.glob("crates/*/src")):
        for root in ("lib.rs", "main.rs"):
            if (src / root).is_file():
                for file, targets in RustCrate(src / root).edges().items():
                    graph.setdefault(file, set()).update(targets)
    return graph


def python_graph(repo: Path) -> dict[Path, set[Path]]:
    graph: dict[Path, set[Path]] = {}
    folders = sorted({p.parent for p in (repo / "scripts").rglob("*.py") if "testdata" not in p.relative_to(repo).parts})
    for folder in folders:
        local = {p.stem: p for p in folder.glob("*.py")}
        for file in local.values():
            try:
                tree = ast.parse(file.read_text(encoding="utf-8"), filename=str(file))
            except SyntaxError as e:
                bad_input(f"error: {file}:{e.lineno}: not valid Python: {e.msg}")
            targets = set()
            for node in ast.walk(tree):
                names = []
                if isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names = [node.module]
                for name in names:
                    top = name.split(".")[0]
                    if top in local and local[top] != file:
                        targets.add(local[top])
            graph[file] = targets
    return graph


def circles(graph: dict[Path, set[Path]]) -> list[list[Path]]:
    """Strongly connected components of two or more files (Tarjan, iterative)."""
    index: dict[Path, int] = {}
    low: dict[Path, int] = {}
    on_stack: set[Path] = set()
    stack: list[Path] = []
    found: list[list[Path]] = []
    counter = 0
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph.get(start, ()))))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            advanced = False
            for child in children:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                    advanced = True
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            if advanced:
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return sorted(found)


def read_allow_list(path: Path, repo: Path) -> list[tuple[str, frozenset[str], int]]:
    """(owner, files, line number) per entry; blank lines and `#` comments skipped."""
    entries = []
    if not path.is_file():
        return entries
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        owner, sep, files = line.partition(":")
        if not sep or not owner.strip() or len(files.split()) < 2:
            bad_input(f"error: {path}:{n}: expected `owner: file file …` (two files or more), got {line!r}")
        for f in files.split():
            if not (repo / f).is_file():
                bad_input(f"error: {path}:{n}: {f} is not a file under {repo}")
        entries.append((owner.strip(), frozenset(files.split()), n))
    return entries


def main(argv: list[str]) -> int:
    here = Path(__file__).resolve().parent
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", type=Path, default=here.parent, help="repository root (crates/, scripts/)")
    parser.add_argument("--allow", type=Path, help="allow-list (default ROOT/scripts/import-circles-allowed.txt)")
    parser.add_argument("--verbose", action="store_true", help="print every import edge")
    args = parser.parse_args(argv)
    repo = args.root.resolve()
    allow_path = args.allow or repo / "scripts" / "import-circles-allowed.txt"

    graph = rust_graph(repo)
    graph.update(python_graph(repo))
    if args.verbose:
        for file in sorted(graph):
            for target in sorted(graph[file]):
                print(f"{file.relative_to(repo)} -> {target.relative_to(repo)}")
    found = {frozenset(str(f.relative_to(repo)) for f in c) for c in circles(graph)}
    allowed = read_allow_list(allow_path, repo)

    failed = False
    for circle in sorted(found, key=sorted):
        entry = next((e for e in allowed if e[1] == circle), None)
        files = " ".join(sorted(circle))
        if entry is None:
            print(f"import circle: {files}")
            failed = True
        else:
            print(f"allowed import circle (owner {entry[0]}, {allow_path.name}:{entry[2]}): {files}")
    for owner, files, n in allowed:
        if files not in found:
            print(
                f"stale allow-list entry {allow_path.name}:{n} (owner {owner}): "
                f"{' '.join(sorted(files))} is no longer a circle; remove the line"
            )
            failed = True
    files_seen = len(graph)
    edges = sum(len(t) for t in graph.values())
    print(f"{files_seen} files, {edges} imports, {len(found)} circles ({len(allowed)} allowed)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
