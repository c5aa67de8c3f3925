"""``python -m verify REF [CAND]``: see :mod:`verify.standalone`."""

import sys

from .standalone import main

sys.exit(main())
