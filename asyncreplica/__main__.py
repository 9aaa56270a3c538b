"""Run the command line as ``python -m asyncreplica``."""

from __future__ import annotations

import sys

from asyncreplica._tools._cli import main

if __name__ == "__main__":
    sys.exit(main())
