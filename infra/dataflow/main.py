"""Flex Template launcher entry (FLEX_TEMPLATE_PYTHON_PY_FILE): see beam_preprocess/flex_template.py."""

import sys

from beam_preprocess.flex_template import main

sys.exit(main())
