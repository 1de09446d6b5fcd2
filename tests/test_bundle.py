"""app/bundle.py: our ES modules as one module (the page's script, one request). The browser's own reading of the
page's modules is the reference in tests/browser/test_views.py::test_page_script_is_one_bundle; here, small module
trees and what the combiner must refuse."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from attnscope.app.bundle import BundleError, bundle, module_order

JS = Path(__file__).resolve().parents[1] / "static" / "js"


def tree(tmp_path: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    return tmp_path / "main.js"


def test_bundle_orders_binds_and_exports(tmp_path):
    entry = tree(tmp_path, {
        "main.js": 'import { a, b as bee } from "./lib/x.js";\nimport * as y from "./y.js";\n'
                   "export const out = a + bee + y.c;\nexport function f() { return out; }\n",
        "lib/x.js": 'import { c } from "../y.js";\nexport const a = c, b = [1, 2].length, s = "1, z = 2", '
                    "r = /[,;]/g;\nexport async function g() {}\nconst hidden = 1;\n",
        "y.js": "export const c = 40;\nexport class K {}\n",
    })
    assert [p.relative_to(tmp_path).as_posix() for p in module_order(entry)] == ["y.js", "lib/x.js", "main.js"]
    out = bundle(entry)
    assert re.findall(r"^// ---- (\S+\.js)$", out, re.M) == ["y.js", "lib/x.js", "main.js"]   # y.js once, first
    assert 'const { c } = __modules["y.js"];' in out
    assert 'const { a, b: bee } = __modules["lib/x.js"];' in out and 'const y = __modules["y.js"];' in out
    assert '__modules["lib/x.js"] = (() => {' in out
    assert "return Object.freeze({ __proto__: null, a, b, g, r, s });" in out       # every declarator, not `hidden`
    assert "\nexport const out = a + bee + y.c;\nexport function f()" in out         # the entry keeps its exports
    assert out.count("export ") == 3 and out.rstrip().endswith("export { __modules as modules };")
    assert "import " not in out


@pytest.mark.parametrize("files, message", [
    ({"main.js": 'import { a } from "./x.js";\n', "x.js": 'import { b } from "./main.js";\nexport const a = 1;\n'},
     "import cycle: main.js -> x.js -> main.js"),
    ({"main.js": 'import { nope } from "./x.js";\n', "x.js": "export const a = 1;\n"}, "x.js does not export nope"),
    ({"main.js": 'import { a } from "./gone.js";\n'}, "gone.js, which is not a file"),
    ({}, "the entry main.js, which is not a file"),
    ({"main.js": "export default 1;\n"}, "not an export the bundle understands"),
    ({"main.js": "export let n = 1;\n"}, "not an export the bundle understands"),
    ({"main.js": "export { a };\nconst a = 1;\n"}, "not an export the bundle understands"),
    ({"main.js": "export const { a, b } = {};\n"}, "not an export the bundle understands"),
    ({"main.js": 'import {\n  a } from "./x.js";\n'}, "not an import the bundle understands"),
    ({"main.js": 'import plotly from "plotly";\n'}, "not an import the bundle understands"),
    ({"main.js": 'const m = import("./x.js");\n'}, "dynamic import()"),
    ({"main.js": "const __modules = 1;\n"}, "uses the name __modules"),
])
def test_bundle_refuses_what_it_does_not_understand(tmp_path, files, message):
    with pytest.raises(BundleError, match=re.escape(message)):
        bundle(tree(tmp_path, files))


def test_the_page_bundle_holds_every_module_once():
    order = module_order(JS / "main.js")
    names = [p.relative_to(JS).as_posix() for p in order]
    assert names[-1] == "main.js" and len(names) == len(set(names)) > 40 and "views/head.js" in names
    out = bundle(JS / "main.js")
    assert re.findall(r"^// ---- (\S+\.js)$", out, re.M) == names
    assert not re.search(r"^import ", out, re.M) and not re.search(r"^export (?!\{ __modules as modules \};)", out, re.M)
