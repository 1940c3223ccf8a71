"""The runtime adapters' pure parts: command lines, slots, vLLM's metrics, llama-server's KV use, process trees."""

from __future__ import annotations

from adapters import LlamaServerRuntime, OpenAIRuntime, Residence
from adapters.base import EngineUsage
from adapters.llama_server import kv_in_use
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


def test_vllms_kv_cache_use_is_its_own_gauge_under_either_name_averaged_over_its_engines() -> None:
    new = ('# TYPE vllm:kv_cache_usage_perc gauge\n'
           'vllm:kv_cache_usage_perc{engine="0",model_name="tiny"} 0.25\n'
           'vllm:kv_cache_usage_perc{engine="1",model_name="tiny"} 0.75\n')
    load = read_vllm_load(new)
    assert load is not None and load.kv_usage == 0.5 and (load.running, load.waiting) == (None, None)
    assert load.says_load
    old = '# TYPE vllm:gpu_cache_usage_perc gauge\nvllm:gpu_cache_usage_perc{model_name="tiny"} 0.125\n'
    assert read_vllm_load(old) == EngineUsage(kv_usage=0.125)  # builds before vllm#18354 named it so
    both = new + '# TYPE vllm:gpu_cache_usage_perc gauge\nvllm:gpu_cache_usage_perc{model_name="tiny"} 0.9\n'
    assert read_vllm_load(both) == EngineUsage(kv_usage=0.5)  # the newer name wins
    odd = '# TYPE vllm:kv_cache_usage_perc gauge\nvllm:kv_cache_usage_perc{model_name="tiny"} 3.0\n'
    assert read_vllm_load(odd) == EngineUsage(kv_usage=1.0)  # never past 0..1, whatever it says
    nan = '# TYPE vllm:kv_cache_usage_perc gauge\nvllm:kv_cache_usage_perc{model_name="tiny"} NaN\n'
    assert read_vllm_load(nan) is None
    queue = 'vllm:num_requests_running{model_name="tiny"} 1.0\n'
    assert read_vllm_load(queue) == EngineUsage(running=1)  # no KV gauge: no KV figure
    assert not EngineUsage(memory=5).says_load


# The real llama-server's /slots (llama.cpp from llama-cpp-python 0.3.36): an idle slot that never ran
# says four fields; one that ran (or runs) says its sequence's tokens too, n_prompt_tokens.
IDLE = {"id": 0, "n_ctx": 1024, "speculative": False, "is_processing": False}


def slot(n_ctx: int, tokens: int, processing: bool, index: int = 1) -> dict[str, object]:
    return {"id": index, "n_ctx": n_ctx, "speculative": False, "is_processing": processing, "id_task": 7,
            "n_prompt_tokens": tokens, "n_prompt_tokens_processed": tokens, "n_prompt_tokens_cache": 0,
            "next_token": [{"has_next_token": processing, "has_new_line": False, "n_remain": -1, "n_decoded": 3}]}


def test_llama_servers_kv_use_is_its_computing_slots_tokens_over_its_cache() -> None:
    # Separate caches (`-c 2048 -np 2`: two slots of 1024): they add up.
    assert kv_in_use([IDLE, slot(1024, 256, True)], shared=False) == 256 / 2048
    # One shared cache (`-np` left to it: 4 slots, each may fill all 4096 cells): its size, not the sum.
    shared = [{**IDLE, "id": i, "n_ctx": 4096} for i in range(3)] + [slot(4096, 1024, True, 3)]
    assert kv_in_use(shared, shared=True) == 0.25
    # An idle slot's cache (the last conversation kept, or one restored) is free: it never makes work wait.
    assert kv_in_use([IDLE, slot(1024, 900, False)], shared=False) == 0.0
    assert kv_in_use([slot(1024, 5000, True, 0)], shared=False) == 1.0
    for answer in ([], {"slots": []}, [IDLE, "x"], [{"id": 0, "n_ctx": 0, "is_processing": False}],
                   [{"id": 0, "n_ctx": True, "is_processing": False}], [{"id": 0, "is_processing": True}], None):
        assert kv_in_use(answer, shared=False) is None, answer
    # A computing slot with an odd count holds nothing countable, and the rest still counts.
    assert kv_in_use([slot(1024, 100, True, 0), {**slot(1024, 0, True), "n_prompt_tokens": -3}], shared=False) == \
        100 / 2048


def test_whether_llama_servers_slots_share_one_cache_follows_its_flags_and_env() -> None:
    def shared(**entry: object) -> bool:
        return LlamaServerRuntime(model(command="llama-server", **entry)).shared_kv  # type: ignore[arg-type]

    assert shared()  # the number of slots left to it (-np -1): 4 slots, one cache
    assert shared(args=["-np", "-1"])
    assert not shared(parallel=2) and not shared(args=["--parallel", "3"])
    assert shared(parallel=2, args=["-kvu"]) and shared(parallel=2, env={"LLAMA_ARG_KV_UNIFIED": "on"})
    assert not shared(args=["--no-kv-unified"]) and not shared(env={"LLAMA_ARG_KV_UNIFIED": "false"})
    assert not shared(args=["-kvu", "-no-kvu"]) and shared(parallel=2, args=["-no-kvu", "--kv-unified"])  # the last
    assert not shared(parallel=2, env={"LLAMA_ARG_KV_UNIFIED": "maybe"})
    runtime = LlamaServerRuntime(model(command="llama-server"))  # type: ignore[arg-type]
    assert runtime.slots_endpoint and "/slots" in runtime.poll_paths
    assert not LlamaServerRuntime(model(command="llama-server", args=["--no-slots"])).slots_endpoint  # type: ignore[arg-type]
    assert not LlamaServerRuntime(model(command="llama-server",  # type: ignore[arg-type]
                                        env={"LLAMA_ARG_ENDPOINT_SLOTS": "0"})).slots_endpoint


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


async def test_llama_servers_kv_read_is_bounded_and_says_nothing_when_it_cannot() -> None:
    """A slow, refusing or garbled /slots is no figure (the last one stays); never an exception."""
    import httpx

    answers: list[object] = []
    timeouts: list[object] = []

    def handler(request: httpx.Request) -> httpx.Response:
        assert request.url.path == "/slots"
        timeouts.append(request.extensions["timeout"]["read"])
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        assert isinstance(answer, httpx.Response)
        return answer

    runtime = LlamaServerRuntime(model(command="llama-server", parallel=2))  # type: ignore[arg-type]
    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as http:
        answers.append(httpx.Response(200, json=[IDLE, slot(1024, 512, True)]))
        assert await runtime.read_usage(http, "http://engine") == EngineUsage(kv_usage=0.25)
        for answer in (httpx.ReadTimeout("busy with a long prompt"), httpx.ConnectError("gone"),
                       httpx.Response(501, json={"error": {"message": "This server does not support slots"}}),
                       httpx.Response(200, text="not json"), httpx.Response(200, json={"slots": 1})):
            answers.append(answer)
            assert await runtime.read_usage(http, "http://engine") is None, answer
    assert timeouts and all(t == 2.0 for t in timeouts)  # USAGE_TIMEOUT_S: each read bounded
    silent = LlamaServerRuntime(model(command="llama-server", args=["--no-slots"]))  # type: ignore[arg-type]
    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as http:
        assert await silent.read_usage(http, "http://engine") is None  # not asked at all: no answer was queued
