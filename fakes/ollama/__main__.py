"""``python -m fakes.ollama``: run the fake until SIGTERM/SIGINT."""

import sys

from fakes.ollama.server import main

if __name__ == "__main__":
    sys.exit(main())
