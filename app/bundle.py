"""Our own ES modules as one module: an entry (e.g. static/js/main.js) and every module it imports, at any depth, in
one text that a browser loads with one request, nothing fetched from the network and no node/npm.

    bundle(entry: Path) -> str        the entry's module with its imports inlined; it exports what the entry exports,
                                      and `modules` (every bundled module's namespace, by its path relative to the
                                      entry's folder, e.g. modules["views/head.js"]: tests and benches read one)
    module_order(entry) -> [Path]     the modules in the order a browser evaluates them (the entry last)

It understands the one style static/js is written in, and refuses (BundleError, naming the file and line) anything
else rather than guess: imports are single lines `import { a, b as c } from "./x.js";` or `import * as x from
"./x.js";` with relative paths; exports are declarations `export function|async function|class|const NAME`. No
default exports, `export {...}` lists, `export let/var` (a live binding that can change), dynamic `import()`,
`import.meta`, bare specifiers, or import cycles. Each imported module becomes a function scope run once, in the
browser's order (dependencies first, in the order they are imported), returning a frozen namespace; a named import
of something its module does not export is an error here, as it is when a browser links the modules.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

IMPORT = re.compile(r'^import (?:\* as (?P<ns>[A-Za-z_$][\w$]*)|\{(?P<names>[^{}]*)\}) from "(?P<spec>\.{1,2}/[^"]+)";'
                    r"[ \t]*$")
EXPORT = re.compile(r"^export (?:async )?(?:function\s*\*?|class|const) *(?P<name>[A-Za-z_$][\w$]*)")
IMPORT_WORD = re.compile(r"^import\b")
EXPORT_WORD = re.compile(r"^export\s")
DECLARATOR = re.compile(r"\s*([A-Za-z_$][\w$]*)\s*=")
IDENT = re.compile(r"^[A-Za-z_$][\w$]*$")
FORBIDDEN = (re.compile(r"\bimport\s*\("), re.compile(r"\bimport\.meta\b"))
REGISTRY = "__modules"         # the bundle's own name for the namespaces; a module that uses it is refused


class BundleError(ValueError):
    """A module the combiner does not understand, a missing file, a name not exported, or an import cycle."""


def _declared(text: str, start: int, where: str) -> list[str]:
    """The names a `const` statement starting at text[start:] (after `const `) declares: `A = ..., B = ...;` up to
    its `;` at bracket depth 0, skipping strings, template literals, comments and regular expressions."""
    names, i, depth, n = [], start, 0, len(text)
    expect_name, prev = True, "="          # prev: the last significant character (a `/` after it starts a regex)
    while i < n:
        if expect_name:
            m = DECLARATOR.match(text, i)
            if not m:
                raise BundleError(f"{where}: cannot read the names this export declares (destructuring?)")
            names.append(m[1])
            i, expect_name, prev = m.end(), False, "="
            continue
        c = text[i]
        if c in "\"'`":
            j = i + 1
            while j < n and text[j] != c:
                j += 2 if text[j] == "\\" else 1
            i, prev = j + 1, c
            continue
        if text.startswith("//", i):
            i = text.find("\n", i)
            i = n if i < 0 else i
            continue
        if text.startswith("/*", i):
            i = text.index("*/", i) + 2
            continue
        if c == "/" and prev in "(,=:[!&|?{};+-*%<>~^":
            j, in_class = i + 1, False
            while j < n and (in_class or text[j] != "/"):
                if text[j] == "\\":
                    j += 1
                elif text[j] == "[":
                    in_class = True
                elif text[j] == "]":
                    in_class = False
                j += 1
            i, prev = j + 1, "/"
            continue
        if c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
        elif depth == 0 and c == ",":
            expect_name = True
        elif depth == 0 and c == ";":
            return names
        if not c.isspace():
            prev = c
        i += 1
    raise BundleError(f"{where}: the export's statement has no closing `;`")


@dataclass
class _Module:
    path: Path
    lines: list[str]           # the source with each import line replaced by its binding
    exports: list[str]
    export_at: list[int]       # the lines (0-based) whose `export ` was taken off
    imports: list[tuple[Path, str | None, list[tuple[str, str]], int]]   # (module, namespace, [(name, local)], line)


def _parse(path: Path) -> _Module:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise BundleError(f"{path}: cannot read it ({e.strerror})") from None
    if REGISTRY in text:
        raise BundleError(f"{path}: uses the name {REGISTRY}, which the bundle keeps for itself")
    lines, exports, export_at, imports = [], [], [], []
    offset = 0
    for no, line in enumerate(text.splitlines(keepends=True), 1):
        at, offset = offset, offset + len(line)
        line = line.rstrip("\r\n")
        where = f"{path}:{no}"
        for bad in FORBIDDEN:
            if bad.search(line):
                raise BundleError(f"{where}: dynamic import() and import.meta cannot be bundled")
        if IMPORT_WORD.match(line):
            m = IMPORT.match(line)
            if not m:
                raise BundleError(f'{where}: not an import the bundle understands (one line, `import {{ a, b as c }} '
                                  f'from "./x.js";` or `import * as x from "./x.js";`): {line.strip()}')
            target = (path.parent / m["spec"]).resolve()
            names = []
            if m["names"] is not None:
                for item in filter(None, (s.strip() for s in m["names"].split(","))):
                    parts = item.split()
                    if len(parts) == 3 and parts[1] == "as":
                        name, local = parts[0], parts[2]
                    elif len(parts) == 1:
                        name = local = parts[0]
                    else:
                        raise BundleError(f"{where}: cannot read the imported name {item!r}")
                    if not (IDENT.match(name) and IDENT.match(local)):
                        raise BundleError(f"{where}: cannot read the imported name {item!r}")
                    names.append((name, local))
            imports.append((target, m["ns"], names, no))
            lines.append(None)            # filled in once every module is read (the binding names its module)
            continue
        if EXPORT_WORD.match(line):
            m = EXPORT.match(line)
            if not m:
                raise BundleError(f"{where}: not an export the bundle understands (`export function|async function|"
                                  f"class|const NAME`; no default, lists, let or var): {line.strip()}")
            if line.startswith("export const"):
                exports += _declared(text, at + len("export const"), where)
            else:
                exports.append(m["name"])
            export_at.append(no - 1)
            line = line[len("export "):]
        lines.append(line)
    if len(set(exports)) != len(exports):
        raise BundleError(f"{path}: exports a name twice")
    return _Module(path, lines, exports, export_at, imports)


def _graph(entry: Path) -> tuple[list[_Module], Path]:
    """Every module the entry reaches, dependencies first in import order (a browser's evaluation order)."""
    entry = entry.resolve()
    done: dict[Path, _Module] = {}
    order: list[_Module] = []
    stack: list[Path] = []

    def visit(path: Path) -> None:
        if path in done:
            return
        if path in stack:
            cycle = stack[stack.index(path):] + [path]
            raise BundleError("import cycle: " + " -> ".join(_rel(p, entry.parent) for p in cycle))
        if not path.is_file():
            who = f"{_rel(stack[-1], entry.parent)} imports {path.name}" if stack else f"the entry {path.name}"
            raise BundleError(f"{who}, which is not a file: {path}")
        stack.append(path)
        mod = _parse(path)
        for target, *_ in mod.imports:
            visit(target)
        stack.pop()
        done[path] = mod
        order.append(mod)

    visit(entry)
    return order, entry


def _rel(path: Path, root: Path) -> str:
    try:
        return path.relative_to(root).as_posix()
    except ValueError:
        raise BundleError(f"{path} is outside the entry's folder {root}") from None


def _namespace(exports: list[str]) -> str:
    """A module's namespace object as a browser makes it: its exports by name in sorted order, frozen, no
    prototype."""
    return "Object.freeze({ __proto__: null" + "".join(f", {e}" for e in sorted(exports)) + " })"


def module_order(entry: Path) -> list[Path]:
    """The modules `entry` imports at any depth and itself, in the order a browser evaluates them."""
    return [m.path for m in _graph(entry)[0]]


def bundle(entry: Path) -> str:
    """The entry module and every module it imports as one ES module (load it with <script type="module">): the
    same exports as the entry, plus `modules`, each bundled module's namespace by its path relative to the entry's
    folder. Raises BundleError for what it does not understand (see the module's docstring)."""
    order, entry = _graph(entry)
    root = entry.parent
    exported = {m.path: set(m.exports) for m in order}
    out = [f"// {_rel(entry, root)} and the {len(order) - 1} modules it imports, as one module (app/bundle.py)",
           f"const {REGISTRY} = Object.create(null);"]
    for mod in order:
        name = _rel(mod.path, root)
        lines = list(mod.lines)
        slots = iter(i for i, line in enumerate(lines) if line is None)
        for (target, ns, names, no), slot in zip(mod.imports, slots):
            key = _rel(target, root)
            missing = [n for n, _ in names if n not in exported[target]]
            if missing:
                raise BundleError(f"{name}:{no}: {key} does not export {', '.join(missing)}")
            binding = ns if ns else "{ " + ", ".join(n if n == loc else f"{n}: {loc}" for n, loc in names) + " }"
            lines[slot] = f'const {binding} = {REGISTRY}["{key}"];'
        if mod.path == entry:
            # the entry runs at the bundle's top level with its exports kept: the bundle exports what it exports
            if "modules" in mod.exports:
                raise BundleError(f"{name}: exports `modules`, which the bundle exports itself")
            for i in mod.export_at:
                lines[i] = "export " + lines[i]
            out += [f"// ---- {name}", "// (the entry: its exports are the bundle's)", *lines,
                    f'{REGISTRY}["{name}"] = {_namespace(mod.exports)};',
                    f"export {{ {REGISTRY} as modules }};", ""]
        else:
            out += [f"// ---- {name}", f'{REGISTRY}["{name}"] = (() => {{', *lines,
                    f"return {_namespace(mod.exports)};", "})();"]
    return "\n".join(out)
