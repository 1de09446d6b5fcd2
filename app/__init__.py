"""The web layer: routes, schemas, settings, service (plan -> run -> payload), wire codec, client, CLI."""

__version__ = "0.2.0"   # the package's (attnscope.__version__): here, where the web layer reads it without importing
#                         the package root (which imports this layer lazily: attnscope.load)
