"""``python -m fakes.openai_server``: run the fake until SIGTERM/SIGINT."""

import sys

from fakes.openai_server.server import main

if __name__ == "__main__":
    sys.exit(main())
