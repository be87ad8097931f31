"""``python -m flowkernel.cli``: the same as the ``flowkernel`` command."""

import os
import sys

from flowkernel.cli import main

os.environ.setdefault("PYTHONUNBUFFERED", "1")
sys.exit(main())
