"""``python -m fakes.comfyui``: run the fake until SIGTERM/SIGINT."""

import sys

from fakes.comfyui.server import main

if __name__ == "__main__":
    sys.exit(main())
