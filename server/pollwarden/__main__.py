"""`python -m pollwarden`."""

import sys

from pollwarden.cli import main

sys.exit(main())
