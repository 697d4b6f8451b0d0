"""`python -m bayesadmm` is the `bayesadmm` command."""

import sys

from bayesadmm.cli import main

sys.exit(main())
