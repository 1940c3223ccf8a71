"""``python -m fakes.speech_server``: run the fake Kokoro-FastAPI until SIGTERM/SIGINT."""

import sys

from fakes.speech_server.server import main

if __name__ == "__main__":
    sys.exit(main())
