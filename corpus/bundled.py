"""The bundled corpus: sentences from the docstrings of the Python standard library, so an atlas runs offline with
no data to find. The standard library is always installed; its docstrings are under the Python Software Foundation
License (PSF-2.0), which allows copying and derived works with the licence notice kept (docs/atlas.md).

The texts are the sentences of the docstrings of MODULES (each module, and each public class, function and method
in it, in name order) that are MIN_CHARS to MAX_CHARS characters long, each once, in that order: a few thousand
short sentences of English prose about code. The same Python version gives the same file: the docstrings are read
by a Python of their own (isolated, no site packages), because what a process has imported changes them (transformers
adds `warning_once` to logging.Logger, other packages replace functions of `inspect`): read in the test process and in
a server, the "same" 12 texts were 436 and 415 tokens.
"""
from __future__ import annotations

import importlib
import inspect
import json
import re
import subprocess
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
    """The corpus, in order (see the module's docstring), read by this file run in an isolated Python (-I -S: only
    the standard library, nothing else imported)."""
    out = subprocess.run([sys.executable, "-I", "-S", __file__], capture_output=True, text=True, check=True).stdout
    return json.loads(out)


def _read() -> list[str]:
    """The corpus, read in this process (as imported here: run only in a Python of its own, by sentences())."""
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


if __name__ == "__main__":                 # sentences(): the corpus read in a Python of its own
    json.dump(_read(), sys.stdout)
