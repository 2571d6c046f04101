"""`python -m beam_preprocess --help`."""

import sys

from beam_preprocess.cli import main

sys.exit(main())
