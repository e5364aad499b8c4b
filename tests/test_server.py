"""labs.server through the official `openai` client: completions and chat, streamed and whole, bad
requests, the API key, admission control, /metrics, and a client that leaves mid-stream (its KV
blocks must come back). A tiny random-weight model on the CPU; each test sends a few short requests."""

from __future__ import annotations

import json
import time

import pytest

pytest.importorskip("fastapi")
openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")

from labs.server.app import build_app  # noqa: E402
from labs.server.metrics import parse as parse_metrics  # noqa: E402
from tests.server_helpers import running, tiny_llm, wait_until  # noqa: E402

MODEL = "tiny-llama"


@pytest.fixture(scope="module")
def server():
    llm = tiny_llm()
    app = build_app(llm)
    with running(app) as url:
        yield url, llm


@pytest.fixture()
def client(server):
    url, _ = server
    return openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=30)


def _metrics(url: str) -> dict[str, float]:
    r = httpx.get(url + "/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    return parse_metrics(r.text)


def test_completion_whole_and_streamed_agree(client):
    whole = client.completions.create(model=MODEL, prompt="The KV cache", max_tokens=6, temperature=0,
                                      extra_body={"ignore_eos": True})
    assert whole.choices[0].finish_reason == "length"
    assert whole.usage.prompt_tokens == len("The KV cache".encode()) and whole.usage.completion_tokens == 6
    chunks = list(client.completions.create(model=MODEL, prompt="The KV cache", max_tokens=6, temperature=0,
                                            stream=True, stream_options={"include_usage": True},
                                            extra_body={"ignore_eos": True}))
    texts = [c.choices[0].text for c in chunks if c.choices]
    assert len(texts) == 6  # one event per token
    assert "".join(texts) == whole.choices[0].text  # greedy: the same tokens either way
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].usage.completion_tokens == 6 and not chunks[-1].choices


def test_prompt_as_token_ids(client):
    out = client.completions.create(model=MODEL, prompt=[1, 2, 3, 4, 5], max_tokens=3, temperature=0,
                                    extra_body={"ignore_eos": True})
    assert out.usage.prompt_tokens == 5 and out.usage.completion_tokens == 3


def test_chat_whole_and_streamed(client):
    msgs = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    whole = client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=4, temperature=0,
                                           extra_body={"ignore_eos": True})
    assert whole.choices[0].message.role == "assistant" and whole.usage.completion_tokens == 4
    stream = list(client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=4, temperature=0,
                                                 stream=True, extra_body={"ignore_eos": True}))
    assert stream[0].choices[0].delta.role == "assistant"
    content = "".join(c.choices[0].delta.content or "" for c in stream)
    assert content == whole.choices[0].message.content
    assert stream[-1].choices[0].finish_reason == "length"


def test_models_and_health(server, client):
    url, llm = server
    assert [m.id for m in client.models.list().data] == [MODEL]
    assert httpx.get(url + "/health").status_code == 200


@pytest.mark.parametrize("kwargs, param", [
    (dict(max_tokens=0), "max_tokens"),
    (dict(max_tokens=4, temperature=5.0), "temperature"),
    (dict(max_tokens=4, top_p=0), "top_p"),
    (dict(max_tokens=4, n=2), "n"),
    (dict(max_tokens=4, extra_body={"max_token": 3}), "max_token"),
    (dict(max_tokens=300), "prompt"),  # cannot grow past the KV pool's max_model_len
])
def test_bad_completion_requests_get_openai_errors(client, kwargs, param):
    with pytest.raises(openai.BadRequestError) as err:
        client.completions.create(model=MODEL, prompt="x" * 40, **kwargs)
    body = err.value.body
    assert err.value.status_code == 400 and body["type"] == "BadRequestError" and body["param"] == param
    assert body["message"]


def test_bad_bodies(server, client):
    url, _ = server
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="gpt-17", prompt="x", max_tokens=1)
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model=MODEL, messages=[{"role": "robot", "content": "x"}], max_tokens=2)
    assert err.value.body["param"] == "messages"
    r = httpx.post(url + "/v1/completions", content=b"{not json", headers={"content-type": "application/json"})
    assert r.status_code == 400 and r.json()["error"]["code"] == 400
    r = httpx.post(url + "/v1/completions", json={"model": MODEL, "prompt": ""})
    assert r.status_code == 400 and r.json()["error"]["param"] == "prompt"
    # nothing leaked into the engine
    assert wait_until(lambda: _metrics(url)["vllm:num_requests_running{model_name=\"tiny-llama\",engine=\"0\"}"] == 0)


def test_disconnect_mid_stream_frees_blocks(server):
    url, llm = server
    usable = llm.blocks.num_usable
    before = _metrics(url)
    aborted = 'vllm:request_success_total{model_name="tiny-llama",engine="0",finished_reason="abort"}'
    body = {"model": MODEL, "prompt": "a" * 16, "max_tokens": 230, "temperature": 0, "ignore_eos": True,
            "stream": True}
    with httpx.Client(timeout=30) as h, h.stream("POST", url + "/v1/completions", json=body) as r:
        assert r.status_code == 200
        got = 0
        for line in r.iter_lines():
            if line.startswith("data: {"):
                got += 1
                if got == 3:
                    assert llm.blocks.num_free < usable  # it holds blocks while it runs
                    break
    # the connection is closed here, long before 230 tokens
    assert wait_until(lambda: llm.blocks.num_free == usable and not llm.scheduler.running)
    after = _metrics(url)
    assert after[aborted] == before[aborted]  # vLLM 0.33 counts no client disconnect as a finished request
    running = 'vllm:num_requests_running{model_name="tiny-llama",engine="0"}'
    assert after[running] == 0
    assert after['vllm:kv_cache_usage_perc{model_name="tiny-llama",engine="0"}'] == 0


def test_metrics_count_finished_requests(server, client):
    url, _ = server
    before = _metrics(url)
    client.completions.create(model=MODEL, prompt="count me", max_tokens=5, temperature=0,
                              extra_body={"ignore_eos": True})
    after = _metrics(url)
    gen = 'vllm:generation_tokens_total{model_name="tiny-llama",engine="0"}'
    ok = 'vllm:request_success_total{model_name="tiny-llama",engine="0",finished_reason="length"}'
    ttft = 'vllm:time_to_first_token_seconds_count{model_name="tiny-llama",engine="0"}'
    assert after[gen] - before[gen] == 5 and after[ok] - before[ok] == 1 and after[ttft] - before[ttft] == 1
    itl = 'vllm:inter_token_latency_seconds_count{model_name="tiny-llama",engine="0"}'
    assert after[itl] - before[itl] == 4


def test_ttft_is_observed_at_the_first_token_not_at_the_finish():
    """As vLLM's output processor does: a request still decoding has already counted in the TTFT histogram."""
    llm = tiny_llm()
    step = llm.step

    def slow_step():  # 20 ms a step: 200 tokens keep the request running while the test scrapes
        time.sleep(0.02)
        return step()

    llm.step = slow_step
    ttft = 'vllm:time_to_first_token_seconds_count{model_name="tiny-llama",engine="0"}'
    ok = 'vllm:request_success_total{model_name="tiny-llama",engine="0",finished_reason="length"}'
    with running(build_app(llm)) as url:
        body = {"model": MODEL, "prompt": "a" * 8, "max_tokens": 200, "ignore_eos": True, "stream": True}
        with httpx.Client(timeout=30) as h, h.stream("POST", url + "/v1/completions", json=body) as r:
            lines = r.iter_lines()
            next(lines)  # the first token has streamed
            during = _metrics(url)
            assert during.get(ttft) == 1 and during.get(ok, 0) == 0
            for _ in lines:
                pass
        after = _metrics(url)
        assert after[ttft] == 1 and after[ok] == 1  # observed once, not again at the finish


def test_api_key_guards_v1_only_and_admission_control():
    llm = tiny_llm(max_num_seqs=1)
    step = llm.step

    def slow_step():  # 20 ms a step: the held request is still running when the next one comes
        time.sleep(0.02)
        return step()

    llm.step = slow_step
    app = build_app(llm, api_keys=["sesame"], max_num_queued_reqs=1)
    with running(app) as url:
        bad = openai.OpenAI(base_url=url + "/v1", api_key="wrong", max_retries=0)
        with pytest.raises(openai.AuthenticationError):
            bad.models.list()
        assert httpx.post(url + "/v1/completions", json={}).json() == {"error": "Unauthorized"}
        assert httpx.get(url + "/health").status_code == 200  # unguarded, as in vLLM
        assert httpx.get(url + "/metrics").status_code == 200
        good = openai.OpenAI(base_url=url + "/v1", api_key="sesame", max_retries=0)
        assert good.models.list().data[0].id == MODEL
        # one request in flight fills the queue; the next is shed with 503
        body = {"model": MODEL, "prompt": "b" * 8, "max_tokens": 200, "ignore_eos": True, "stream": True}
        with httpx.Client(timeout=30, headers={"Authorization": "Bearer sesame"}) as h:
            with h.stream("POST", url + "/v1/completions", json=body) as r:
                lines = r.iter_lines()  # kept: a dropped iterator closes the stream, which is a disconnect
                next(lines)
                with pytest.raises(openai.InternalServerError) as err:
                    good.completions.create(model=MODEL, prompt="c", max_tokens=1)
                assert err.value.status_code == 503
        rej = 'vllm:admission_rejections_total{model_name="tiny-llama",reason="max_num_queued_reqs"}'
        assert parse_metrics(httpx.get(url + "/metrics").text)[rej] == 1


@pytest.mark.parametrize("args, word", [(["--port", "70000"], "--port"), (["--max-num-seqs", "0"], "--max-num-seqs"),
                                        (["--tiny", "--weights", "."], "--tiny"), (["--dtype", "int3"], "--dtype"),
                                        (["--max-num-queued-reqs", "-1"], "--max-num-queued-reqs")])
def test_cli_refuses_bad_arguments(capsys, args, word):
    from labs.server.__main__ import main

    with pytest.raises(SystemExit) as exc:
        main(args)
    err = capsys.readouterr().err
    assert exc.value.code == 2 and word in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_metric_names_are_vllms():
    from labs import vllm_facts
    from labs.server import metrics

    for name in (*metrics.GAUGES, *metrics.COUNTERS, *metrics.HISTOGRAMS):
        assert vllm_facts.metric(name)[0] == name
    json.dumps(metrics.FACTS)  # plain data
