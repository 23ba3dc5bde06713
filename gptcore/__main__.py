"""``python -m gptcore``: see gptcore.cli."""

import sys

from gptcore.cli import main

if __name__ == "__main__":
    sys.exit(main())
