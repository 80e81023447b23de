"""Measure the package's shape: the numbers behind docs/architecture.md's rules.

    python scripts/architecture_metrics.py [SRC_ROOT]      # default: the checkout this script is in

Prints one line per measure: top-level modules, import cycles (strongly connected groups of
ssacli modules, counting imports inside functions too), cross-module imports of `_private` names,
how many modules define each owned fact, and the longest function. Run it on an older checkout
(e.g. a `git worktree`) to compare.
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

ROOT = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parents[1]
PKG = ROOT / "ssacli"

# Each owned fact, as the definitions that state it (a file counts once per fact).
FACTS = {
    "checkpoint format (ssacli.json / trainer file names)": re.compile(
        r"""(META_FILE|TRAINER_FILE)\s*=|["']ssacli\.json["']|["']trainer\.safetensors["']"""
    ),
    "model kind (decided from class names)": re.compile(r"""["']ForCausalLM["']"""),
    "metric metadata (descriptions/directions)": re.compile(
        r"""["']max_weight["']\s*:\s*(\(|["']|MetricSpec|\{)|MetricSpec\(\s*["']max_weight["']"""
    ),
    "exit codes": re.compile(r"^\s*EXIT_\w+\s*(,\s*EXIT_\w+\s*)*=", re.M),
}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path, tree: ast.AST) -> list[tuple[str, list[str]]]:
    """(absolute module, imported names) for every import of an ssacli module in the file."""
    mod = module_name(path)
    package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)] if node.level > 1 else base
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.split(".")[0] == "ssacli":
                found.append((target, [a.name for a in node.names]))
        elif isinstance(node, ast.Import):
            found += [(a.name, []) for a in node.names if a.name.split(".")[0] == "ssacli"]
    return found


def main() -> None:
    files = sorted(p for p in PKG.rglob("*.py") if "checkpoints" not in p.parts)
    modules = {module_name(p): p for p in files}
    graph: dict[str, set[str]] = {m: set() for m in modules}
    private, longest, facts = [], (0, ""), {k: set() for k in FACTS}
    for path in files:
        text = path.read_text()
        tree = ast.parse(text)
        mod = module_name(path)
        for target, names in imports(path, tree):
            for name in names or [""]:
                sub = f"{target}.{name}" if name else target
                dest = sub if sub in modules else target
                if dest in modules and dest != mod:
                    graph[mod].add(dest)
                if name.startswith("_") and not name.startswith("__") and target != mod:
                    private.append(f"{mod} <- {target}.{name}")
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                size = node.end_lineno - node.lineno + 1
                if size > longest[0]:
                    longest = (size, f"{mod}.{node.name}")
        for fact, pattern in FACTS.items():
            if pattern.search(text):
                facts[fact].add(mod)
    cycles = strongly_connected(graph)
    top = [p for p in PKG.glob("*.py") if p.name not in ("__init__.py", "__main__.py")]
    print(f"top-level modules: {len(top)}")
    print(f"import cycles: {len(cycles)}" + "".join(f"\n  {' <-> '.join(sorted(c))}" for c in cycles))
    print(f"cross-module private imports: {len(private)}" + "".join(f"\n  {p}" for p in sorted(private)))
    for fact, mods in facts.items():
        print(f"modules defining {fact}: {len(mods)} ({', '.join(sorted(mods))})")
    print(f"longest function: {longest[1]} ({longest[0]} lines)")


def strongly_connected(graph: dict[str, set[str]]) -> list[set[str]]:
    """Tarjan's algorithm; groups of two or more modules that import each other, directly or not."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = set()
            while True:
                w = stack.pop()
                on.discard(w)
                group.add(w)
                if w == v:
                    break
            if len(group) > 1:
                out.append(group)

    sys.setrecursionlimit(10_000)
    for v in graph:
        if v not in index:
            visit(v)
    return out


if __name__ == "__main__":
    main()
