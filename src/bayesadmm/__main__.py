"""`python -m bayesadmm` is the `bayesadmm` command."""

import sys

from bayesadmm.cli import main

if __name__ == "__main__":  # only when run: importing this module (as a crafted state once could) runs nothing
    sys.exit(main())
