"""`python -m attnscope ...` is the `attnscope` command."""
import sys

from .python.cli import main

sys.exit(main())
