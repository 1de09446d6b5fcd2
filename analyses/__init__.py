"""The analyses: one module each (request, checks and price, computation, answer, payload, Python methods, MCP tools),
listed once in analyses/registry.py; every surface (REST, the Python API, MCP, the page) is made from that list."""

__version__ = "0.2.0"   # the package's (attnscope.__version__), and part of every answer's ETag: here, the lowest layer
#                         that reads it, as a literal (pyproject.toml reads it without importing anything)
