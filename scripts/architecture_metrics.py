# Long on purpose: one file, so tests load it by path and scripts/ (a count it reports) gains no helpers.
"""Measure the package's shape: the numbers behind docs/architecture.md's rules.

    python scripts/architecture_metrics.py [SRC_ROOT]      # default: the checkout this script is in

Prints one line per measure: top-level modules, import cycles (strongly connected groups of ssacli
modules, counting imports inside functions too), cross-module imports of `_private` names, how many
modules define each owned fact, and the longest function; then the restructure's table (issue 23):
eager attention implementations (places that multiply attention weights by values outside the fused
kernels), places that define each default or fact (help texts that restate one:
:data:`RESTATED_DEFAULT`), string comparisons of model kinds and routes, CLI options whose default
is a literal (:func:`_literal_defaults`), public names, re-exports (names in a module's ``__all__``
it only imports; the lazy public names of ``ssacli/__init__.py`` and ``ssacli/preflight.py`` aside:
:data:`LAZY_PUBLIC_MODULES`), ``duplicates`` pairs, and
(``--trace``) the files the diagnose tensor crosses: every ssacli file (scorers aside: the plug-in
being measured) with a function that receives a 4-d tensor between the attention function's entry
and ``row_sums``, plus the files on the call stack when ``row_sums`` runs, measured with
``sys.setprofile`` on a tiny Llama (one reference level and one logit-scale level, eager
statistics). Run it on an older checkout (e.g. a `git worktree`) to compare.
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

ARGS = [a for a in sys.argv[1:] if not a.startswith("--")]
ROOT = Path(ARGS[0]).resolve() if ARGS else Path(__file__).resolve().parents[1]
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
    restructure_table(files)
    one_representation_table(files)
    if "--trace" in sys.argv:
        trace_diagnose_tensor()


# ---- issue 41's table ------------------------------------------------------------------------------

# A derivation of the per-row attention metrics (entropy, max weight, collapse, ... from a row's
# statistics): a Python function named *row_sums*. Apart from them, the producers of the statistics a
# derivation reads: Python functions that build a RowStatistics, and the C function named row (the
# native kernels' row pass). Issue 41 first counted the C row() and *row_statistics functions among
# the derivations; since the statistics became one type they are its producers, not derivations.
ROW_DERIVATION = re.compile(r"^def (\w*row_sums)\(", re.M)
ROW_PRODUCER_C = re.compile(r"^static [^;{]*\brow\(", re.M | re.S)
# What the CLI may import (issue 41): the public API (ssacli/__init__.py, and ssacli.preflight, the
# checks it runs before the model stack loads), the shared owners of errors and defaults,
# ssacli.files, the one definition of how an output file is written (atomically; exit 4 when it cannot),
# and ssacli.setting, how a settings field declares the option the CLI builds from it (issue 53)
SHARED_OWNERS = {
    "ssacli",
    "ssacli.preflight",
    "ssacli.errors",
    "ssacli.defaults",
    "ssacli.files",
    "ssacli.setting",
}
PARAMETER_LIMIT = 12
# A keyword wrapper of ssacli.__all__ is exempt from the limit only while it is thin: it builds the
# settings objects and calls the function that takes them, in at most this many lines (docstring aside)
THIN_WRAPPER_LINES = 15
# Documented public entries of ssacli.__all__ whose keyword options are the API itself rather than a
# wrapper over a settings value (issue 41 item 2 exempts the documented keyword API), each with why
DOCUMENTED_KEYWORD_ENTRIES = {
    ("ssacli.kernels.fused", "ssa_attention"): "ssacli.ssa_attention in docs/api.md: tensors positional, "
    "options keywords, as torch's scaled_dot_product_attention",
}
# Modules whose __all__ names are loaded on first use (PEP 562): public names, not re-exports
LAZY_PUBLIC_MODULES = ("__init__.py", "preflight.py")


def one_representation_table(files: list[Path]) -> None:
    """Issue 41's measures: row-metric derivations, the largest parameter counts, the CLI's imports of
    internal modules, the files in scripts/ and studies/."""
    derivations, producers = [], []
    for path in sorted(PKG.rglob("*")):
        if path.suffix not in (".py", ".c") or "checkpoints" in path.parts:
            continue
        text, where = path.read_text(), path.relative_to(PKG.parent)
        if path.suffix == ".c":
            producers += [f"{where}:{_line(text, m)}" for m in ROW_PRODUCER_C.finditer(text)]
            continue
        derivations += [f"{where}:{_line(text, m)}" for m in ROW_DERIVATION.finditer(text)]
        producers += [f"{where}:{line}" for line in _row_statistics_builders(text)]
    counts, kernels, exceptions, entries = [], [], [], []
    internal = []
    exempt = _commands_and_keyword_wrappers()
    submodules = {module_name(f) for f in files}
    for path in files:
        tree = ast.parse(path.read_text())
        mod = module_name(path)
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                args = node.args
                names = [a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs)]
                names = [n for n in names if n not in ("self", "cls")]
                entry = (len(names), f"{mod}.{node.name}")
                if any(ast.unparse(d).endswith("triton.jit") for d in node.decorator_list):
                    kernels.append(entry)  # Triton's calling convention: one argument per pointer and stride
                elif (mod, node.name) in DOCUMENTED_KEYWORD_ENTRIES and (mod, node.name) in exempt:
                    entries.append((*entry, DOCUMENTED_KEYWORD_ENTRIES[mod, node.name]))
                elif (mod, node.name) in exempt and (
                    mod.startswith("ssacli.cli") or _body_lines(node) <= THIN_WRAPPER_LINES
                ):
                    exceptions.append(entry)
                else:
                    counts.append(entry)
        if mod.startswith("ssacli.cli"):
            for target, names in imports(path, tree):
                if target.startswith("ssacli.cli"):
                    continue
                # `from ssacli import diagnosis` reaches past the API: a module, not a public name
                reaches_module = target == "ssacli" and any(
                    f"ssacli.{n}" in submodules and f"ssacli.{n}" not in SHARED_OWNERS for n in names
                )
                if target in SHARED_OWNERS and not reaches_module:
                    continue
                internal.append(f"{mod} <- {target}")
    counts.sort(reverse=True)
    over = [c for c in counts if c[0] > PARAMETER_LIMIT]
    # the tools and the studies' files; READMEs (what each is for) and caches are not counted
    scripts = [p for p in (PKG.parent / "scripts").glob("*") if p.is_file() and p.suffix != ".md"]
    studies = sorted(p for p in (PKG.parent / "studies").glob("*") if p.is_dir())
    study_files = [p for s in studies for p in s.glob("*") if p.is_file() and p.suffix != ".md"]
    print(f"row-metric derivations: {len(derivations)} ({', '.join(derivations)})")
    print(f"row-statistic producers: {len(producers)} ({', '.join(producers)})")
    print(f"functions over {PARAMETER_LIMIT} parameters: {len(over)}; largest: "
          + ", ".join(f"{name} {n}" for n, name in counts[:5]))  # fmt: skip
    kernels.sort(reverse=True)
    exceptions.sort(reverse=True)
    exceptions = [e for e in exceptions if e[0] > PARAMETER_LIMIT]
    kernels = [k for k in kernels if k[0] > PARAMETER_LIMIT]
    print(f"  exceptions: {len(exceptions)} Typer commands and thin keyword wrappers of ssacli.__all__ ("
          + ", ".join(f"{name.removeprefix('ssacli.')} {n}" for n, name in exceptions) + ")")  # fmt: skip
    entries = [e for e in sorted(entries, reverse=True) if e[0] > PARAMETER_LIMIT]
    shown = ", ".join(f"{name.removeprefix('ssacli.')} {n}: {why}" for n, name, why in entries)
    print(f"  documented keyword entries over {PARAMETER_LIMIT}: {len(entries)} ({shown})")
    shown = ", ".join(f"{name.rpartition('.')[2]} {n}" for n, name in kernels)
    print(f"  Triton kernels over {PARAMETER_LIMIT} (@triton.jit: pointers and strides, Triton's calling "
          f"convention): {len(kernels)} ({shown})")  # fmt: skip
    print(
        f"CLI imports of internal modules: {len(internal)} statements from "
        f"{len({i.split(' <- ')[1] for i in internal})} modules"
    )
    print(f"files in scripts/: {len(scripts)}; studies/: {len(studies)} studies, {len(study_files)} files")


def _commands_and_keyword_wrappers() -> set[tuple[str, str]]:
    """(module, function) of the Typer commands (``app.command(...)(module.function)`` in
    ssacli/cli/__init__.py) and of the public functions of ``ssacli.__all__`` (its lazy map, "module" or
    "module:name"): the functions issue 41 lets take more than PARAMETER_LIMIT parameters."""
    found = set()
    cli = PKG / "cli" / "__init__.py"
    for node in ast.walk(ast.parse(cli.read_text())):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Call)
            and getattr(node.func.func, "attr", None) == "command"
            and node.args
            and isinstance(node.args[0], ast.Attribute)
            and isinstance(node.args[0].value, ast.Name)
        ):
            found.add((f"ssacli.cli.{node.args[0].value.id}", node.args[0].attr))
    for node in ast.walk(ast.parse((PKG / "__init__.py").read_text())):
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", None) == "_LAZY":
            for name, where in ast.literal_eval(node.value).items():
                module, _, attribute = where.partition(":")
                found.add((f"ssacli.{module}", attribute or name))
    return found


def _body_lines(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """The lines of a function's body, its docstring aside (Typer commands: their whole body counts too,
    they are exempt by name)."""
    body = node.body[1:] if ast.get_docstring(node) is not None else node.body
    return body[-1].end_lineno - body[0].lineno + 1 if body else 0


def _line(text: str, match: re.Match) -> int:
    return text[: match.start()].count("\n") + 1


def _row_statistics_builders(text: str) -> list[int]:
    """The lines of the functions in ``text`` that build a RowStatistics (the innermost function)."""
    lines = []
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            inner = {id(n) for child in node.body for n in ast.walk(child)
                     if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}  # fmt: skip
            calls = [
                n for child in node.body for n in ast.walk(child)
                if isinstance(n, ast.Call) and getattr(n.func, "id", None) == "RowStatistics"
            ]  # fmt: skip
            if calls and not inner:
                lines.append(node.lineno)
    return sorted(lines)


# ---- issue 23's table ------------------------------------------------------------------------------

EAGER = re.compile(r"matmul\(\s*weights|weights(\.to\([^)]*\))?\s*@\s*value")
DEFINITIONS = {  # a default or fact, as the lines that define or restate it
    "ICL points": re.compile(
        r"ICL_POINTS\s*=|\b(points|points_end|icl_length|length)\s*(:\s*int)?\s*=\s*4[01]\b"
        r"|Option\(\s*4[01]\b|\(4[01],\)|\b4[01]\s*\]|[\"']4[01],"
    ),
    "model kinds": re.compile(r"\bKINDS\s*=\s*\(|class ModelKind\b"),
    "tau": re.compile(r"\bTAU\s*=|tau\s*(:\s*float)?\s*=\s*0\.9\b|\(0\.9\)"),
    # (an entropy requirement's ">= 0.5" is another threshold)
    "collapse share": re.compile(r"COLLAPSE_SHARE\s*=|^(?!.*entropy@).*>=\s*0\.5\b"),
}
# A help text that states a default as a literal, rather than formatting it from the constant: "(default
# 8)", "(default cosine)", "(0.9)", "default 5% of …", "tiny (default)", "[1024 tiny, 4096 small, …]".
# "default: …" describing what None means ("default: the config's") states no value. Read from every
# ``help=`` argument and every ``*_HELP`` constant of the CLI, strings that span lines included, with
# each f-string placeholder as "{}" (a formatted default is no restatement).
RESTATED_DEFAULT = re.compile(
    r"\(default\s+[^\s{}(),;:]+\)|\bdefault:?\s+\d|\((1e-\d|0\.\d+)\)|\w \(default\)|\[\d+ \w+, \d+"
)
KIND_OR_ROUTE = re.compile(
    r"(==|!=)\s*[\"'](icl|causal|masked|encoder|seq2seq|ssacli|eager-fallback)[\"']"
    r"|\bin\s*[\(\[{]\s*[\"'](icl|causal|masked|encoder|seq2seq|eager-fallback)[\"']"
    r"|\.value\s*==",
)


def restructure_table(files: list[Path]) -> None:
    defs: dict[str, list[str]] = {k: [] for k in [*DEFINITIONS, "help text restating a default"]}
    eager, compares, literal, public, reexports = [], [], [], 0, []
    for path in files:
        text = path.read_text()
        rel = path.relative_to(ROOT).as_posix()
        in_kernels = "/kernels/" in rel
        for number, line in enumerate(text.splitlines(), 1):
            code = line.split("#")[0]
            if EAGER.search(code) and not in_kernels and '"""' not in line and "``" not in line:
                eager.append(f"{rel}:{number}")
            for fact, pattern in DEFINITIONS.items():
                if pattern.search(code):
                    defs[fact].append(f"{rel}:{number}")
            if KIND_OR_ROUTE.search(code):
                compares.append(f"{rel}:{number}")
        tree = ast.parse(text)
        if "/cli/" in rel or SETTING_CALL in text:  # the CLI, and the settings fields its options come from
            literal += [f"{rel}:{n}" for n in _literal_defaults(tree)]
            defs["help text restating a default"] += [f"{rel}:{n}" for n in _restated_defaults(tree)]
        names = _all_names(tree)
        if names is None:
            continue
        if path.parent == PKG and path.name in LAZY_PUBLIC_MODULES:
            public = len(names) if path.name == "__init__.py" else public
            continue
        defined = {
            n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef))
        }
        for node in tree.body:
            targets = (
                node.targets
                if isinstance(node, ast.Assign)
                else [node.target]
                if isinstance(node, ast.AnnAssign)
                else []
            )
            defined |= {t.id for t in targets if isinstance(t, ast.Name)}
        reexports += [f"{module_name(path)}.{n}" for n in names if n not in defined]
    print(f"eager attention implementations: {len(eager)} ({', '.join(eager)})")
    for fact, places in defs.items():
        print(f"places defining {fact}: {len(places)} ({', '.join(places)})")
    print(f"kind/route string comparisons: {len(compares)} ({', '.join(compares)})")
    print(f"CLI options with a literal default: {len(literal)} ({', '.join(literal)})")
    print(f"public names (ssacli.__all__): {public}")
    print(f"re-exports: {len(reexports)}")
    print(f"duplicates pairs (duplicates --repo ssacli): {_duplicate_pairs()}")


TYPER_PARAMETERS = ("typer.Option", "typer.Argument")
SETTING_CALL = "setting("  # a settings field with its option (ssacli.setting.setting(default, help, …))


def _literal(node: ast.AST) -> bool:
    """A value written out: a number or string (None, a flag's True/False and ``...`` are no default
    value), or a list or tuple of them."""
    if isinstance(node, ast.Constant):
        return node.value is not None and not isinstance(node.value, bool) and node.value is not Ellipsis
    if isinstance(node, ast.UnaryOp):
        return _literal(node.operand)
    if isinstance(node, ast.List | ast.Tuple):
        return bool(node.elts) and all(_literal(e) for e in node.elts)
    return False


def _literal_defaults(tree: ast.AST) -> list[int]:
    """Lines of CLI parameters whose default is a literal: ``typer.Option(4000, …)`` (or Argument),
    ``device: Device = "auto"`` (an option type, its default in the signature), and settings fields
    with an option, ``setting(4000, …)`` (issue 53: the options are built from those fields)."""
    lines = [
        call.lineno
        for call in ast.walk(tree)
        if isinstance(call, ast.Call)
        and ast.unparse(call.func) == "setting"
        and call.args
        and _literal(call.args[0])
    ]
    for func in ast.walk(tree):
        if not isinstance(func, ast.FunctionDef):
            continue
        args = func.args.args + func.args.kwonlyargs
        defaults = [None] * (len(func.args.args) - len(func.args.defaults)) + func.args.defaults
        for arg, default in zip(args, defaults + func.args.kw_defaults):
            if default is None:
                continue
            if isinstance(default, ast.Call) and ast.unparse(default.func) in TYPER_PARAMETERS:
                if default.args and _literal(default.args[0]):
                    lines.append(default.lineno)
            elif arg.annotation is not None and _literal(default):
                lines.append(default.lineno)
    return lines


def _restated_defaults(tree: ast.AST) -> list[int]:
    """Lines of CLI help texts that restate a default (:data:`RESTATED_DEFAULT`)."""
    lines = []
    for node in ast.walk(tree):
        values = []
        if isinstance(node, ast.keyword) and node.arg == "help":
            values.append(node.value)
        elif isinstance(node, ast.Call) and ast.unparse(node.func) == "setting" and len(node.args) > 1:
            values.append(node.args[1])  # setting(default, help, …)
        elif isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id.endswith("HELP") for t in node.targets
        ):
            values.append(node.value)
        for value in values:
            text = "".join(_literal_text(value))
            if RESTATED_DEFAULT.search(text):
                lines.append(value.lineno)
    return lines


def _literal_text(node: ast.AST) -> list[str]:
    """The written parts of a help expression: strings, f-strings with "{}" for each placeholder,
    ``+`` of them; anything else (a name, a call) as "{}"."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, ast.JoinedStr):
        return [v.value if isinstance(v, ast.Constant) else "{}" for v in node.values]
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        return _literal_text(node.left) + _literal_text(node.right)
    return ["{}"]


def _all_names(tree: ast.AST) -> list[str] | None:
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets
        ):
            try:
                return list(ast.literal_eval(node.value))
            except ValueError:
                return None
    return None


def _duplicate_pairs() -> str:
    import shutil
    import subprocess

    if shutil.which("duplicates") is None:
        return "n/a (the duplicates tool is not installed)"
    out = subprocess.run(
        ["duplicates", "--repo", str(PKG), "--seconds", "120"], capture_output=True, text=True, cwd=ROOT
    ).stdout
    first = out.strip().splitlines()[0] if out.strip() else "no output"
    return first


def trace_diagnose_tensor() -> None:
    """The files the diagnose tensor crosses, measured (see the module docstring)."""
    sys.path.insert(0, str(ROOT))
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    import ssacli

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64,
    )  # fmt: skip
    model = LlamaForCausalLM(config).eval()
    pkg = str(PKG) + "/"
    crossed: set[str] = set()
    state = {"inside": False}

    def rel(filename: str) -> str:
        return Path(filename).resolve().relative_to(ROOT).as_posix()

    def profile(frame, event, arg):
        if event != "call" or not frame.f_code.co_filename.startswith(pkg):
            return
        name = frame.f_code.co_name
        if name == "ssacli_attention_forward":
            state["inside"] = True
        if name == "row_sums":
            stack = frame
            while stack is not None:
                if stack.f_code.co_filename.startswith(pkg):
                    crossed.add(rel(stack.f_code.co_filename))
                stack = stack.f_back
            state["inside"] = False
            return
        if state["inside"] and "/scorers/" not in frame.f_code.co_filename:
            if any(isinstance(v, torch.Tensor) and v.dim() == 4 for v in frame.f_locals.values()):
                crossed.add(rel(frame.f_code.co_filename))

    sys.setprofile(profile)
    try:
        ssacli.diagnose(model, ["logit-scale:1,8"], inputs=[list(range(3, 19))] * 2, samples=2, stats="eager")
    finally:
        sys.setprofile(None)
    print(f"files the diagnose tensor crosses: {len(crossed)} ({', '.join(sorted(crossed))})")


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
