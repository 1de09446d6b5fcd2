"""`python -m attnscope ...` is the `attnscope` command."""
import sys

from .app.cli import main

sys.exit(main())
