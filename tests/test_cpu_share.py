"""Compute placement on the host's cores (supervisor/accounting/cpu_share.py, docs/compute.md):
the pure decision, the config keys' refusals, the command steward starts llama-server with, the
CPU set its process runs on, `steward check`'s lines, and (slow) a real llama-server that says
how many threads it got."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import trio
import yaml

from fakes.llama_binary import llama_server_path
from fakes.real_model import smollm2_gguf
from supervisor.accounting.cpu_share import (
    CpuSet,
    EngineCompute,
    HostCpus,
    ShareSource,
    decide_shares,
    describe_share,
    usable_cpus,
)
from supervisor.config import ConfigError, parse_config
from supervisor.config_policy import compute_shares, engine_specs
from supervisor.engines.process import SpawnError, open_child, stop_child
from tests.conftest import ROOT, RunningSteward, StewardFactory, fake_model

GIB = 1024**3


def llama(name: str, **fields: Any) -> EngineCompute:
    return EngineCompute(name, "llama-server", spawned=True, **fields)


def threads(engines: list[EngineCompute], cores: int, lower_class_engines: int = 1,
            budget: int | None = None) -> dict[str, int | None]:
    plan = decide_shares(engines, lower_class_engines, budget, HostCpus.of(range(cores)))
    assert plan.problems == []
    return {name: share.threads for name, share in plan.shares.items()}


FOUR = [llama(name, memory=GIB) for name in "abcd"]


# --- the decision ---------------------------------------------------------------------------------

def test_two_cores_and_one_lower_class_engine_give_each_engine_one_thread() -> None:
    plan = decide_shares(FOUR, 1, 3 * GIB, HostCpus.of(range(2)))
    assert {name: share.threads for name, share in plan.shares.items()} == dict.fromkeys("abcd", 1)
    share = plan.shares["a"]
    assert share.source is ShareSource.AUTO and share.cpus is None
    assert share.how == ("2 cores / 2 engines at once (1 interactive + scheduler.lower_class_engines 1) = 1; "
                         "on any CPU")
    assert describe_share(share) == f"1 thread (--threads, --threads-batch): {share.how}"


def test_sixteen_cores_are_split_between_the_engines_that_may_compute_at_once() -> None:
    assert threads(FOUR, 16) == dict.fromkeys("abcd", 8)
    assert threads(FOUR, 16, lower_class_engines=2) == dict.fromkeys("abcd", 5)  # 16 // 3
    assert threads(FOUR, 2, lower_class_engines=3) == dict.fromkeys("abcd", 1)  # never 0
    assert threads(FOUR[:1], 16) == {"a": 16}  # one engine computes alone
    alone = decide_shares(FOUR[:1], 1, None, HostCpus.of(range(16))).shares["a"].how
    assert alone == ("16 cores / 1 engine at once (1 interactive + scheduler.lower_class_engines 1, but steward "
                     "starts only 1 engine) = 16; on any CPU")
    two_fit = decide_shares(FOUR, 2, 2 * GIB, HostCpus.of(range(16))).shares["a"].how
    assert "(1 interactive + scheduler.lower_class_engines 2, but only 2 engines can be resident at once)" in two_fit


def test_no_limit_counts_every_engine_that_can_be_resident_at_once() -> None:
    assert threads(FOUR, 16, lower_class_engines=0, budget=3 * GIB) == dict.fromkeys("abcd", 5)  # 3 fit: 16 // 3
    assert threads(FOUR, 16, lower_class_engines=0) == dict.fromkeys("abcd", 4)  # no budget known: all 4
    # An engine whose size the config does not give counts as fitting: never more threads than cores.
    unknown = [*FOUR[:3], llama("e")]
    assert threads(unknown, 16, lower_class_engines=0, budget=2 * GIB) == dict.fromkeys("abce", 5)
    plan = decide_shares(FOUR, 0, 3 * GIB, HostCpus.of(range(16)))
    assert "scheduler.lower_class_engines 0: every engine that can be resident at once, 3 of 4 in the memory " \
           "budget" in plan.shares["a"].how
    # With a limit, fewer resident than the limit bound it too.
    assert threads([llama("a", memory=2 * GIB), llama("b", memory=2 * GIB)], 8, budget=3 * GIB) == {"a": 8, "b": 8}


def test_the_users_threads_win_over_the_share() -> None:
    engines = [llama("auto"), llama("set", threads=6), llama("own", threads_in_args=True),
               EngineCompute("vllm", "openai", spawned=True)]
    plan = decide_shares(engines, 1, None, HostCpus.of(range(16)))
    assert {name: (share.threads, share.source) for name, share in plan.shares.items()} == {
        "auto": (8, ShareSource.AUTO), "set": (6, ShareSource.CONFIG), "own": (None, ShareSource.ARGS),
        "vllm": (None, ShareSource.RUNTIME)}
    assert plan.shares["own"].how == "its args set the thread count; steward passes none; on any CPU"


def test_engines_on_disjoint_cpu_sets_do_not_share_cores() -> None:
    engines = [llama("left", cpus=CpuSet.parse("0-7")), llama("right", cpus=CpuSet.parse("8-15")),
               llama("overlap", cpus=CpuSet.parse("6-9"))]
    plan = decide_shares(engines, 1, None, HostCpus.of(range(16)))
    assert {name: share.threads for name, share in plan.shares.items()} == {"left": 4, "right": 4, "overlap": 2}
    assert plan.shares["overlap"].how.endswith("on CPUs 6-9")
    alone = decide_shares([*engines[:2]], 1, None, HostCpus.of(range(16)))
    assert alone.shares["left"].threads == 8
    assert alone.shares["left"].how == "8 cores / 1 engine at once (only 1 share its CPUs) = 8; on CPUs 0-7"


def test_a_cpu_set_the_host_does_not_offer_is_a_problem_naming_the_key() -> None:
    plan = decide_shares([llama("chat", cpus=CpuSet.parse("4-5,7"))], 1, None, HostCpus.of(range(2)))
    assert plan.problems == ["models.chat.cpus: none of 4-5,7 is a CPU steward may use here (0-1)"]
    partly = decide_shares([llama("chat", cpus=CpuSet.parse("1-3"))], 1, None, HostCpus.of(range(2)))
    assert partly.problems == [] and str(partly.shares["chat"].cpus) == "1"


def test_cpu_lists_read_and_write_as_taskset_does() -> None:
    assert CpuSet.parse("0-3,6").cpus == frozenset({0, 1, 2, 3, 6})
    assert CpuSet.parse(5).cpus == frozenset({5})
    assert str(CpuSet.parse("6, 0-2,3,9-9")) == "0-3,6,9"


def test_a_cgroup_cpu_quota_caps_the_cores_counted(tmp_path: Path) -> None:
    (tmp_path / "cpu.max").write_text("150000 100000\n")
    assert usable_cpus(tmp_path).count == 1  # a quota of 1.5 CPUs keeps one busy
    (tmp_path / "cpu.max").write_text("max 100000\n")
    host = usable_cpus(tmp_path)
    assert host.count == len(host.cpus) > 0


# --- the config -------------------------------------------------------------------------------------

def problems(**model: Any) -> list[str]:
    try:
        parse_config({"models": {"chat": {"command": "llama-server", "memory": "1GiB", **model}}})
    except ConfigError as exc:
        return exc.problems
    return []


def test_bad_threads_and_cpus_are_refused_naming_the_key() -> None:
    assert problems(threads="auto", cpus="0-1") == []
    assert problems(threads=0) == ["models.chat.threads: must be auto or a number of threads 1..8192, got 0"]
    assert problems(threads="all") == ["models.chat.threads: must be auto or a number of threads 1..8192, got 'all'"]
    assert problems(cpus="3-1") == ['models.chat.cpus: must be a CPU list like "0-3,6"; the range 3-1 runs backwards']
    assert problems(cpus=[0, 1]) == ['models.chat.cpus: must be a CPU list like "0-3,6", got a list']
    assert problems(threads=2, args=["-t", "4"]) == [
        "models.chat.threads: set here and as a thread flag in args (or LLAMA_ARG_THREADS in env); keep one"]
    assert problems(threads=2, runtime="openai", command=["vllm", "serve", "--port", "${PORT}"]) == [
        "models.chat.threads: only llama-server takes a thread count from steward; set runtime openai's own in "
        "models.chat.env (vLLM's CPU backend: VLLM_CPU_OMP_THREADS_BIND)"]
    assert problems(cpus="0", runtime="openai", command=None, upstream="127.0.0.1:9000") == [
        "models.chat.cpus: applies to a process steward starts, not to an attached server"]


# --- the command and the process ------------------------------------------------------------------------

def test_llama_server_gets_its_share_once_and_other_runtimes_none() -> None:
    config = parse_config({"gpu": {"probe": "host", "budget": "3GiB"}, "models": {
        "a": {"command": "llama-server", "memory": "1GiB"},
        "b": {"command": "llama-server", "memory": "1GiB", "args": ["--threads=3"]},
        "c": {"command": "llama-server", "memory": "1GiB", "env": {"LLAMA_ARG_THREADS": "2"}, "cpus": "1"},
        "v": {"runtime": "openai", "command": ["vllm", "serve", "--port", "${PORT}"], "memory": "1GiB"}}})
    specs = engine_specs(config, HostCpus.of(range(2)))
    a = specs["a"].command(9000)
    assert a is not None and a[a.index("--threads"):a.index("--threads") + 4] == ["--threads", "1", "--threads-batch",
                                                                                  "1"]
    b = specs["b"].command(9000)
    assert b is not None and b.count("--threads=3") == 1 and "--threads" not in b and "--threads-batch" not in b
    c = specs["c"].command(9000)
    assert c is not None and "--threads" not in c and specs["c"].cpus == CpuSet.parse("1")
    assert specs["v"].command(9000) == ["vllm", "serve", "--port", "9000"]
    assert compute_shares(config, HostCpus.of(range(2))).shares["v"].source is ShareSource.RUNTIME


@pytest.mark.slow
def test_an_engine_process_runs_on_its_cpu_set_only() -> None:
    cpu = min(usable_cpus().cpus.cpus)

    async def run() -> str:
        child = open_child(["grep", "Cpus_allowed_list", "/proc/self/status"], cpus=frozenset({cpu}))
        output = b""
        while chunk := await child.output.receive_some(4096):
            output += chunk
        await stop_child(child, 5)
        return output.decode()

    assert trio.run(run).split() == ["Cpus_allowed_list:", str(cpu)]
    with pytest.raises(SpawnError, match=r"cannot run 'true': none of the CPUs \[8191\] is one steward may run on"):
        open_child(["true"], cpus=frozenset({8191}))


# --- steward check -------------------------------------------------------------------------------------

@pytest.mark.slow
def test_check_prints_each_engines_share(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump({"gpu": {"probe": "host", "budget": "3GiB"}, "state_file": None,
                                    "log": {"file": None}, "usage": {"db": None}, "models": {
        "a": {"command": "llama-server", "memory": "1GiB"},
        "b": {"command": "llama-server", "memory": "1GiB", "threads": 3},
        "c": {"command": "llama-server", "memory": "1GiB", "args": ["-t", "2"]}}}))
    result = subprocess.run([sys.executable, "-m", "supervisor.cli", "check", str(path)], capture_output=True,
                            text=True, timeout=60, cwd=ROOT)
    assert result.returncode == 0, result.stderr
    host = usable_cpus()
    share = max(1, host.count // 2)
    assert f"cpus     {host.count} for the engines ({host.cpus})" in result.stdout
    assert (f"  compute  {share} thread{'s' * (share > 1)} (--threads, --threads-batch): {host.count} "
            f"core{'s' * (host.count > 1)} / 2 engines at once (1 interactive + scheduler.lower_class_engines 1) = "
            f"{share}; on any CPU") in result.stdout
    assert "  compute  3 threads (--threads, --threads-batch): models.b.threads; on any CPU" in result.stdout
    assert "  compute  its args set the thread count; steward passes none; on any CPU" in result.stdout

    path.write_text(yaml.safe_dump({"gpu": {"probe": "host", "budget": "3GiB"}, "state_file": None,
                                    "log": {"file": None}, "usage": {"db": None}, "models": {
        "a": {"command": "llama-server", "memory": "1GiB", "cpus": "8000-8001"}}}))
    refused = subprocess.run([sys.executable, "-m", "supervisor.cli", "check", str(path)], capture_output=True,
                             text=True, timeout=60, cwd=ROOT)
    assert refused.returncode == 2
    assert f"steward: models.a.cpus: none of 8000-8001 is a CPU steward may use here ({host.cpus})" in refused.stderr


# --- a real llama-server --------------------------------------------------------------------------------

@pytest.mark.slow
def test_a_real_llama_server_started_by_steward_computes_with_its_share(start_steward: StewardFactory) -> None:
    binary, gguf = str(llama_server_path()), str(smollm2_gguf())
    models = {name: {"command": binary, "model": gguf, "memory": "1GiB", "parallel": 1, "args": ["-c", "512"],
                     "always_on": name == "chat"} for name in ("chat", "agent")}
    steward = start_steward(models, gpu={"probe": "host", "budget": "3GiB"})
    share = steward.wait_event("compute_share", engine="chat")
    expected = max(1, usable_cpus().count // 2)
    assert share["threads"] == expected and share["source"] == "auto" and share["cpus"] is None
    spawn = steward.wait_event("spawn", engine="chat", timeout=30)
    argv = spawn["argv"]
    assert argv[argv.index("--threads") + 1] == argv[argv.index("--threads-batch") + 1] == str(expected)
    said = engine_line(steward, "chat", "system_info:")
    assert f"n_threads = {expected} (n_threads_batch = {expected})" in said


def engine_line(steward: RunningSteward, engine: str, text: str, timeout: float = 60) -> str:
    """The first line *engine* printed that holds *text* (waited for)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for line in steward.engine_lines(engine):
            if text in line:
                return line
        time.sleep(0.05)
    raise AssertionError(f"{engine} printed no line with {text!r} within {timeout}s")


@pytest.mark.slow
def test_an_engine_steward_starts_runs_on_its_cpu_set(start_steward: StewardFactory) -> None:
    cpu = max(usable_cpus().cpus.cpus)
    steward = start_steward({"pinned": fake_model(always_on=True, cpus=str(cpu), threads=1)},
                            gpu={"probe": "none", "budget": "4GiB"})
    assert steward.wait_event("compute_share", engine="pinned")["cpus"] == str(cpu)
    steward.wait_event("ready", engine="pinned", timeout=30)
    status = Path(f"/proc/{steward.engine_pid('pinned')}/status").read_text()
    assert f"Cpus_allowed_list:\t{cpu}\n" in status
