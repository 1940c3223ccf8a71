"""The /ui page in a real headless Chromium (Debian's ``chromium`` and ``chromium-driver``,
installed by ``deploy/install.sh test``), driven over plain W3C WebDriver with httpx: the
page of a running ``steward demo`` shows its engines, and updates when a request runs.

Every wait is for a state in the page, bounded; chromedriver and the browser it starts are
stopped after the test, and the test checks that none of its browser processes is left.

``python -m tests.test_ui_browser docs/ui.png`` takes the README's screenshot the same way,
after a minute of traffic through the demo (so that the plots of the last hour have points).
"""

from __future__ import annotations

import base64
import contextlib
import os
import signal
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import attrs
import httpx
import pytest

from tests.conftest import free_port, stop_process
from tests.test_demo import Demo, running_demo

DEADLINE_S = 80.0  # the screenshot waits for five 10 s samples
WINDOW = (1280, 900)


@attrs.define
class Browser:
    """One WebDriver session: the few commands the test needs."""

    http: httpx.Client
    session: str

    def command(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        answer = self.http.request(method, f"/session/{self.session}{path}", json=body)
        answer.raise_for_status()
        return answer.json()["value"]

    def open(self, url: str) -> None:
        self.command("POST", "/url", {"url": url})

    def texts(self, css: str) -> list[str]:
        """The text of each element *css* selects, read in one script: the page may be redrawn between two commands."""
        return self.run("return Array.from(document.querySelectorAll(arguments[0]), e => e.innerText)", css)

    def run(self, script: str, *args: Any) -> Any:
        return self.command("POST", "/execute/sync", {"script": script, "args": list(args)})

    def wait_for(self, condition: Callable[[], bool], what: str) -> None:
        """Poll *condition* until true (a WebDriverWait); the browser's round trip paces it."""
        deadline = time.monotonic() + DEADLINE_S
        while not condition():
            if time.monotonic() > deadline:
                raise AssertionError(f"not within {DEADLINE_S:g}s: {what}")

    def size_viewport(self, width: int, height: int) -> None:
        """The page's own area *width* x *height* (a window's size includes what is around it)."""
        self.command("POST", "/window/rect", {"width": width, "height": height})
        inner = self.run("return [window.innerWidth, window.innerHeight]")
        self.command("POST", "/window/rect", {"width": 2 * width - inner[0], "height": 2 * height - inner[1]})

    def screenshot(self, path: Path) -> None:
        path.write_bytes(base64.b64decode(self.command("GET", "/screenshot")))


def browser_processes(profile: Path) -> list[int]:
    """Processes whose command line names *profile* (this test's browser and its helpers)."""
    pids = []
    for entry in Path("/proc").iterdir():
        with contextlib.suppress(OSError):
            if entry.name.isdigit() and str(profile).encode() in (entry / "cmdline").read_bytes():
                pids.append(int(entry.name))
    return pids


@contextlib.contextmanager
def headless_chromium() -> Iterator[Browser]:
    driver_path, chromium = shutil.which("chromedriver"), shutil.which("chromium")
    assert driver_path and chromium, "no chromium/chromedriver: run deploy/install-chromium.sh (install.sh test does)"
    port = free_port()
    profile = Path(tempfile.mkdtemp(prefix="steward-ui-chromium-"))
    driver = subprocess.Popen([driver_path, f"--port={port}"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as http:
            deadline = time.monotonic() + DEADLINE_S
            while True:  # until chromedriver listens
                with contextlib.suppress(httpx.TransportError):
                    if http.get("/status").json()["value"]["ready"]:
                        break
                assert time.monotonic() < deadline and driver.poll() is None, "chromedriver did not start"
            args = ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--hide-scrollbars",
                    f"--window-size={WINDOW[0]},{WINDOW[1]}", f"--user-data-dir={profile}"]
            answer = http.post("/session", json={"capabilities": {"alwaysMatch": {
                "browserName": "chrome", "goog:chromeOptions": {"binary": chromium, "args": args}}}})
            answer.raise_for_status()
            browser = Browser(http, answer.json()["value"]["sessionId"])
            browser.size_viewport(*WINDOW)
            try:
                yield browser
            finally:
                http.delete(f"/session/{browser.session}")
    finally:
        stop_process(driver)  # type: ignore[arg-type]
        left = browser_gone(profile)
        shutil.rmtree(profile, ignore_errors=True)
    assert not left, f"browser processes left behind (killed now): {left}"


def browser_gone(profile: Path) -> list[int]:
    """Waits (bounded) for the browser's processes to exit after their session; kills and
    returns the ones still there."""
    deadline = time.monotonic() + 10.0
    while (left := browser_processes(profile)) and time.monotonic() < deadline:
        time.sleep(0.05)  # polling /proc: no event to wait on for another process tree's exit
    for pid in left:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return left


def ui_url(demo: Demo) -> str:
    return demo.base_url.removesuffix("/v1") + "/ui"


def engine_status(browser: Browser, engine: str) -> str | None:
    rows = [row.split() for row in browser.texts("table.engines tbody tr")]
    return next((row[1] for row in rows if row and row[0] == engine), None)


@pytest.mark.slow
def test_the_page_shows_the_demos_engines_and_follows_a_request() -> None:
    with running_demo() as demo, headless_chromium() as browser:
        browser.open(ui_url(demo))
        browser.wait_for(lambda: engine_status(browser, "gemma4-12b") is not None, "the demo's engines")
        shown = {row.split()[0] for row in browser.texts("table.engines tbody tr")}
        assert {"gemma4-12b", "gemma4-e4b", "gemma4-e2b"} <= shown
        assert engine_status(browser, "gemma4-12b") != "ready"  # nothing asked for it yet
        reply = demo.client().chat.completions.create(model="gpt-4o", max_tokens=4,
                                                      messages=[{"role": "user", "content": "hello"}])
        assert reply.model == "gemma4-12b"
        # The live part refreshes: the engine is loaded now; the event stream shows its load.
        browser.wait_for(lambda: engine_status(browser, "gemma4-12b") == "ready", "the engine shown ready")
        browser.wait_for(lambda: any("gemma4-12b" in row for row in browser.texts("#events li")),
                         "an event row about the request's engine")


def take_screenshot(path: Path) -> None:
    """A 1280x900 PNG of the page after about a minute of mixed traffic through the demo."""
    with running_demo() as demo, headless_chromium() as browser:
        client = demo.client()
        stop = threading.Event()

        def traffic(model: str) -> None:
            while not stop.is_set():
                with contextlib.suppress(Exception):
                    client.chat.completions.create(model=model, max_tokens=40,
                                                   messages=[{"role": "user", "content": "hello"}])

        threads = [threading.Thread(target=traffic, args=(m,)) for m in ("gpt-4o", "gemma4-e2b@background",
                                                                          "gemma4-e2b@batch", "agents")]
        for thread in threads:
            thread.start()
        browser.open(ui_url(demo))
        try:
            browser.wait_for(lambda: browser.run(
                "const line = document.querySelector('svg.plot polyline');"
                "return line ? line.getAttribute('points').split(' ').length : 0") >= 5, "five samples plotted")
        finally:
            stop.set()
            for thread in threads:
                thread.join()
        browser.screenshot(path)


if __name__ == "__main__":
    take_screenshot(Path(sys.argv[1]))
