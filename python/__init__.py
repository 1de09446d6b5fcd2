"""The Python surface, made from the analyses' registry: the in-process model (local.py), the remote Client
(client.py), both with every analysis as a method (api.py), notebook views (jupyter.py), the MCP tools (agents.py)
and the command line (cli.py)."""
