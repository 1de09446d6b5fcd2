"""The bundled corpus: sentences from the docstrings of the Python standard library, so an atlas runs offline with
no data to find. The standard library is always installed; its docstrings are under the Python Software Foundation
License (PSF-2.0), which allows copying and derived works with the licence notice kept (docs/atlas.md).

The texts are the sentences of the docstrings of MODULES (each module, and each public class, function and method
in it, in name order) that are MIN_CHARS to MAX_CHARS characters long, each once, in that order: a few thousand
short sentences of English prose about code. The same Python version gives the same file.
"""
from __future__ import annotations

import importlib
import inspect
import re
import sys
from pathlib import Path

NAME = "bundled"
LICENSE = "PSF-2.0 (Python Software Foundation License): docstrings of the Python standard library"
MODULES = ("argparse", "ast", "asyncio", "base64", "bisect", "calendar", "collections", "configparser", "contextlib",
           "copy", "csv", "dataclasses", "datetime", "decimal", "difflib", "email.message", "enum", "fractions",
           "functools", "glob", "gzip", "hashlib", "heapq", "html", "http.client", "inspect", "io", "ipaddress",
           "itertools", "json", "logging", "mailbox", "math", "operator", "os", "pathlib", "pickle", "pprint",
           "queue", "random", "re", "sched", "secrets", "shlex", "shutil", "socket", "sqlite3", "statistics",
           "string", "subprocess", "tarfile", "tempfile", "textwrap", "threading", "time", "timeit", "tokenize",
           "typing", "unittest", "urllib.parse", "uuid", "warnings", "weakref", "xml.dom.minidom", "zipfile")
MIN_CHARS, MAX_CHARS = 24, 120
_SENTENCE = re.compile(r"(?<=[.!?])\s+(?=[A-Z])")


def _docstrings(module) -> list[str]:
    out = [module.__doc__ or ""]
    for name, obj in sorted(vars(module).items()):
        if name.startswith("_") or getattr(obj, "__module__", None) != module.__name__:
            continue
        out.append(inspect.getdoc(obj) or "")
        if inspect.isclass(obj):
            out += [inspect.getdoc(m) or "" for n, m in sorted(vars(obj).items())
                    if not n.startswith("_") and callable(m)]
    return out


def sentences() -> list[str]:
    """The corpus, in order (see the module's docstring)."""
    seen, texts = set(), []
    for name in MODULES:
        try:
            module = importlib.import_module(name)
        except ImportError:            # a Python built without it (sqlite3, ...): the corpus is a little shorter
            continue
        for doc in _docstrings(module):
            for para in re.split(r"\n\s*\n", doc):
                para = " ".join(para.split())
                for s in _SENTENCE.split(para):
                    if MIN_CHARS <= len(s) <= MAX_CHARS and s[0].isupper() and s not in seen and ">>>" not in s:
                        seen.add(s)
                        texts.append(s)
    return texts


def bundled_path(folder) -> Path:
    """The corpus as a text file (one sentence a line) in `folder`, written once per Python version."""
    path = Path(folder) / f"{NAME}-py{sys.version_info.major}.{sys.version_info.minor}.txt"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        from .job import replace_atomically
        text = "".join(s + "\n" for s in sentences())
        replace_atomically(path, lambda tmp: tmp.write_text(text, encoding="utf-8"))
    return path
