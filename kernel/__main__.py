"""``python -m flowkernel``: the same as the ``flowkernel`` command."""

import sys

from flowkernel.cli import main

sys.exit(main())
