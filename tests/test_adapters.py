"""The runtime adapters' pure parts: command lines, slots, vLLM's metrics, process trees."""

from __future__ import annotations

from adapters import LlamaServerRuntime, OpenAIRuntime, Residence
from adapters.openai import read_vllm_load
from supervisor.address import Address
from supervisor.config import parse_config
from supervisor.gateway.comfy.app import upstream_headers
from supervisor.engines.process_tree import fold_to_roots, tree_of


def model(**entry: object) -> object:
    return parse_config({"models": {"m": {"memory": "1GiB", **entry}}}).models["m"]


def test_llama_server_starts_with_fit_off_unless_its_args_set_fit() -> None:
    argv = LlamaServerRuntime(model(command="llama-server")).command("127.0.0.1", 9000)  # type: ignore[arg-type]
    assert argv[-2:] == ["--fit", "off"] and argv[:6] == ["llama-server", "--host", "127.0.0.1", "--port", "9000",
                                                          "-lv"]
    own = LlamaServerRuntime(model(command="llama-server", args=["--fit", "on"])).command("h", 1)  # type: ignore[arg-type]
    assert own.count("--fit") == 1 and own[-2:] == ["--fit", "on"]
    env = LlamaServerRuntime(model(command="llama-server", env={"LLAMA_ARG_FIT": "on"})).command("h", 1)  # type: ignore[arg-type]
    assert "--fit" not in env


def test_llama_server_is_told_the_models_name_unless_its_args_or_env_give_one() -> None:
    """--alias NAME: its answers' "model" then names the model as steward does, not the GGUF's path."""
    named = LlamaServerRuntime(model(command="llama-server"), served_as="chat").command("h", 1)  # type: ignore[arg-type]
    assert named[named.index("--alias") + 1] == "chat"
    own = LlamaServerRuntime(model(command="llama-server", args=["-a", "mine"]), served_as="chat").command("h", 1)  # type: ignore[arg-type]
    assert "--alias" not in own and own[-2:] == ["-a", "mine"]
    env = LlamaServerRuntime(model(command="llama-server", env={"LLAMA_ARG_ALIAS": "mine"}),  # type: ignore[arg-type]
                             served_as="chat").command("h", 1)
    assert "--alias" not in env
    assert "--alias" not in LlamaServerRuntime(model(command="llama-server")).command("h", 1)  # type: ignore[arg-type]


def test_port_placeholder_in_any_runtimes_command_or_args() -> None:
    llama = LlamaServerRuntime(model(command="llama-server", args=["--port", "${PORT}"]))  # type: ignore[arg-type]
    argv = llama.command("127.0.0.1", 4321)
    assert argv.count("--port") == 1 and argv[argv.index("--port") + 1] == "4321"
    vllm = OpenAIRuntime(model(runtime="openai", command=["vllm", "serve", "m", "--port", "${PORT}"],  # type: ignore[arg-type]
                               args=["--api-url", "http://127.0.0.1:${PORT}/v1"]))
    assert vllm.command("127.0.0.1", 4321) == ["vllm", "serve", "m", "--port", "4321", "--api-url",
                                               "http://127.0.0.1:4321/v1"]
    assert vllm.residence is Residence.SPAWNED and vllm.slots == 8


def test_where_an_openai_engine_lives() -> None:
    attached = OpenAIRuntime(model(runtime="openai", upstream="[::1]:8000"))  # type: ignore[arg-type]
    assert attached.residence is Residence.ATTACHED and attached.command("h", 1) is None
    sleeping = OpenAIRuntime(model(runtime="openai", command=["s", "${PORT}"], sleep={"level": 2}))  # type: ignore[arg-type]
    assert sleeping.residence is Residence.SERVICE and sleeping.sleeps


def test_vllms_gauges_are_summed_over_their_labels() -> None:
    text = ('# HELP vllm:num_requests_running Number of requests in model execution batches.\n'
            '# TYPE vllm:num_requests_running gauge\n'
            'vllm:num_requests_running{engine="0",model_name="tiny"} 2.0\n'
            'vllm:num_requests_running{engine="1",model_name="tiny"} 1.0\n'
            '# TYPE vllm:num_requests_waiting gauge\n'
            'vllm:num_requests_waiting{engine="0",model_name="tiny"} 5.0\n')
    load = read_vllm_load(text)
    assert load is not None and (load.running, load.waiting) == (3, 5)
    assert read_vllm_load("# TYPE other gauge\nother 1\n") is None
    assert read_vllm_load("not { prometheus") is None


def test_an_ipv6_upstream_is_one_typed_address_everywhere() -> None:
    config = parse_config({"models": {}, "comfyui": {"upstream": "[::1]:8189"}})
    assert config.comfyui is not None and config.comfyui.upstream == Address("::1", 8189)
    assert config.comfyui.upstream.url == "http://[::1]:8189"
    headers = upstream_headers([(b"origin", b"http://127.0.0.1:8188"), (b"accept", b"*/*")], config.comfyui.upstream)
    assert headers == [(b"origin", b"http://[::1]:8189"), (b"accept", b"*/*")]


def test_memory_of_descendants_is_counted_under_their_engine() -> None:
    parents = {100: 1, 101: 100, 102: 101, 200: 1, 300: 1}
    assert tree_of(100, parents) == {100, 101, 102}
    folded = fold_to_roots({101: 5, 102: 7, 200: 3, 300: 11}, roots=[100, 200], parents=parents)
    assert folded == {100: 12, 200: 3, 300: 11}  # 300 is no engine's: outside use
