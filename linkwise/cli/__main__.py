"""``python -m linkwise.cli``: the ``linkwise`` command."""

import sys

from linkwise.cli import main

sys.exit(main())
