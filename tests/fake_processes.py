"""Starting the fake runtimes as real processes in tests: one launcher for all three."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import attrs
import httpx

from tests.conftest import FORKSERVER, ForkedProcess, free_port, stop_process

F = TypeVar("F", bound="FakeProcess")


def wait_until(predicate: Callable[[], object], timeout: float = 5.0, interval: float = 0.02) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(interval)


@attrs.define
class FakeProcess:
    """A fake runtime in its own process; subclasses add what their runtime answers."""

    proc: ForkedProcess
    port: int
    log_path: Path
    ready_path: str = "/"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def get(self, path: str, **kwargs: Any) -> httpx.Response:
        return httpx.get(self.url + path, timeout=10, **kwargs)

    def post(self, path: str, body: object = None, **kwargs: Any) -> httpx.Response:
        if body is not None:
            kwargs["json"] = body
        return httpx.post(self.url + path, timeout=10, **kwargs)

    def stats(self) -> dict[str, Any]:
        return self.get("/fake/stats").json()

    def log(self) -> str:
        """Its output so far: nothing until it opens its log (the forkserver's child opens it
        after the start returns: on a busy machine a first read may come before)."""
        try:
            return self.log_path.read_text()
        except FileNotFoundError:
            return ""

    def answers(self) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError(f"fake exited with {self.proc.returncode}:\n{self.log()}")
        try:
            return self.get(self.ready_path).status_code == 200
        except httpx.TransportError:
            return False


@attrs.define
class FakeLauncher:
    """Starts `python -m MODULE --port P ARGS`; every process is stopped (SIGTERM, then SIGKILL) at the end."""

    tmp_path: Path
    started: list[ForkedProcess] = attrs.Factory(list)

    def launch(self, kind: type[F], module: str, args: list[str], *, ready_path: str, wait: bool = True,
               port: int | None = None) -> F:
        port = free_port() if port is None else port
        log_path = self.tmp_path / f"{module.rsplit('.', 1)[-1]}-{len(self.started)}.log"
        proc = FORKSERVER.start(module, ["--port", str(port), *args], output=log_path)  # python -m MODULE ...
        self.started.append(proc)
        fake = kind(proc, port, log_path, ready_path)
        if wait:
            wait_until(fake.answers, timeout=30)
        return fake

    def stop_all(self) -> None:
        for proc in self.started:
            stop_process(proc)


def fake_launcher(tmp_path: Path) -> Iterator[FakeLauncher]:
    launcher = FakeLauncher(tmp_path)
    try:
        yield launcher
    finally:
        launcher.stop_all()
