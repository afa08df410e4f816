"""``python -m dali_alchemi.cli``: the ``dali-alchemi`` command."""

import sys

from dali_alchemi.cli import main

sys.exit(main())
