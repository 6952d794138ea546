"""The ``ostinato`` command line: one module per subcommand, ``main.py`` dispatching them."""
from __future__ import annotations

import json
import sys
from typing import Any


def write_json(obj: Any) -> None:
    """``obj`` as indented JSON on stdout, newline-terminated: every subcommand's ``--json`` output."""
    json.dump(obj, sys.stdout, indent=2)
    sys.stdout.write("\n")
