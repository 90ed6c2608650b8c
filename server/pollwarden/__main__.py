"""`python -m pollwarden`."""

import sys

from pollwarden.cli.main import main

sys.exit(main())
