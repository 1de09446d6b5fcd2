"""The page's ES modules (static/js) as data: the modules an entry imports at any depth, in an order where every
module comes after the ones it imports, each with its relative imports named by module id.

The page loads static/js/*.js itself (pages.py lists them for modulepreload). A view drawn anywhere else (a
notebook's output: app/jupyter.py) carries the same files, read here at run time, never a copy of them:

    for m in modules("embed.js"):        # api.js, dom.js, ..., views/head.js, ..., embed.js
        m.id                              # "views/head.js"
        m.parts                           # ["// Head view ...from \"", "boot.js", "\";\n...", ...]

`parts` alternates the module's text with the ids of the modules it imports (at the odd places: where each import's
specifier stood); joined with each id's own URL, it is the module as the browser would load it from there. The
output's loader (embed.js' host script) makes one Blob URL per module, in this order, and imports the entry: the
modules run as native ES modules, with nothing rewritten but their import specifiers.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

JS = Path(__file__).resolve().parents[1] / "static" / "js"
# a static import of a module of static/js: `import ... from "./x.js";` or "../x.js" (the page's only kind: one line)
IMPORT = re.compile(r'^import .*? from "(\.{1,2}/[^"]+)";', re.M)


@dataclass(frozen=True)
class Module:
    id: str                  # its path under static/js ("views/head.js")
    parts: tuple[str, ...]   # text, id, text, id, ..., text: the text between its imports' specifiers


def resolve(importer: str, spec: str) -> str:
    """The id of the module `spec` names, imported from module `importer` ("views/head.js", "../dom.js" -> "dom.js")."""
    parts: list[str] = []
    for p in (PurePosixPath(importer).parent / spec).parts:
        if p == "..":
            if not parts:
                raise ValueError(f"{importer} imports {spec}, outside static/js")
            parts.pop()
        elif p != ".":
            parts.append(p)
    return "/".join(parts)


def split(module_id: str, text: str) -> tuple[str, ...]:
    """The module's text cut at its imports' specifiers, each replaced by the id it names."""
    parts, at = [], 0
    for m in IMPORT.finditer(text):
        parts += [text[at:m.start(1)], resolve(module_id, m.group(1))]
        at = m.end(1)
    return (*parts, text[at:])


def modules(entry: str, root: Path = JS) -> list[Module]:
    """Every module `entry` imports at any depth, and the entry last; each after the modules it imports. A module
    that is not there, or an import cycle (a loader of one URL per module cannot make one), is a ValueError."""
    done: dict[str, Module] = {}
    on_path: list[str] = []

    def visit(module_id: str, importer: str | None) -> None:
        if module_id in done:
            return
        if module_id in on_path:
            raise ValueError("import cycle: " + " -> ".join(on_path[on_path.index(module_id):] + [module_id]))
        path = root.joinpath(*module_id.split("/"))
        if not path.is_file():
            raise ValueError(f"{importer or 'the entry'} imports {module_id}, which is not in {root.name}/")
        parts = split(module_id, path.read_text(encoding="utf-8"))
        on_path.append(module_id)
        for dep in parts[1::2]:
            visit(dep, module_id)
        on_path.pop()
        done[module_id] = Module(module_id, parts)

    visit(entry, None)
    return list(done.values())


def imported(entry: str, root: Path = JS) -> list[str]:
    """The ids of the modules `entry` imports at any depth (not the entry itself), each after its own imports."""
    return [m.id for m in modules(entry, root)[:-1]]
