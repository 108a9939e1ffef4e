"""`cadence run-batch` (api/run_batch.py): a file of OpenAI Batch API lines through the API's code in
process. Every line gets one output line, in order; a bad line or a refused body gets its error and
the rest still run; greedy results are the server's; a replica killed mid-batch costs no line."""

from __future__ import annotations

import asyncio
import json

import orjson
import pytest

from api import cli
from api.offline import LLM
from api.run_batch import post, read_lines
from core.sampling_params import SamplingParams

ENGINE = ["--model", "qwen3-tiny", "--load-format", "dummy", "--device", "cpu", "--max-model-len", "512",
          "--log-level", "warning"]


def _line(custom_id: str, url: str, body: dict) -> dict:
    return {"custom_id": custom_id, "method": "POST", "url": url, "body": body}


def _run(tmp_path, lines: list, *flags: str) -> tuple[int, list[dict]]:
    source, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    source.write_text("\n".join(x if isinstance(x, str) else json.dumps(x) for x in lines) + "\n")
    code = cli.main(["run-batch", "-i", str(source), "-o", str(out), *ENGINE, *flags])
    return code, [json.loads(line) for line in out.read_text().splitlines()]


@pytest.mark.parametrize(("raw", "problem"), [
    (b"{", "line 1 is not JSON"),
    (b"[1]", "must be a JSON object"),
    (b'{"url": "/v1/completions", "body": {}}', "'custom_id' must be a non-empty string"),
    (b'{"custom_id": "x", "method": "GET", "url": "/v1/completions", "body": {}}', "'method' must be POST"),
    (b'{"custom_id": "x", "url": "/v1/embeddings", "body": {}}', "'url' must be one of"),
    (b'{"custom_id": "x", "url": "/v1/completions", "body": "hi"}', "'body' must be a JSON object"),
    (b'{"custom_id": "x", "url": "/v1/completions", "body": {"stream": true}}', "cannot stream"),
])
def test_a_line_that_is_not_a_request_says_why(raw, problem):
    [line] = read_lines([raw])
    assert problem in line.problem


def test_a_custom_id_used_twice_is_refused_on_its_second_line_and_blank_lines_are_skipped():
    body = orjson.dumps(_line("x", "/v1/completions", {"prompt": "a"}))
    lines = read_lines([body, b"  ", body])
    assert [line.number for line in lines] == [1, 3]
    assert lines[0].problem is None and "used by an earlier line" in lines[1].problem


def test_an_app_that_raises_costs_its_line_a_500_not_the_batch():
    async def echo(scope, receive, send):
        body = (await receive())["body"]
        await send({"type": "http.response.start", "status": 201, "headers": []})
        await send({"type": "http.response.body", "body": body[:2], "more_body": True})
        await send({"type": "http.response.body", "body": body[2:]})

    async def broken(scope, receive, send):
        raise KeyError("nothing here")

    assert asyncio.run(post(echo, "/v1/x", b'{"a": 1}')) == (201, b'{"a": 1}')
    status, body = asyncio.run(post(broken, "/v1/x", b"{}"))
    assert status == 500 and "KeyError" in orjson.loads(body)["error"]["message"]


def test_every_line_gets_its_result_in_order_greedy_as_the_engine_computes(tmp_path):
    prompts = [[5, 17, 42, 99], [7, 7, 7], list(range(10, 60))]
    greedy = {"max_tokens": 6, "temperature": 0, "ignore_eos": True}
    lines = [_line(f"c{i}", "/v1/completions", {"model": "qwen3-tiny", "prompt": p, **greedy})
             for i, p in enumerate(prompts)]
    lines += [
        _line("chat", "/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}],
                                               "max_tokens": 4}),
        _line("resp", "/v1/responses", {"input": "Hi", "max_output_tokens": 3}),
        _line("msg", "/v1/messages", {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3}),
        _line("refused", "/v1/chat/completions", {"messages": [], "max_tokens": 4}),
        _line("too-long", "/v1/completions", {"prompt": list(range(600)), "max_tokens": 4}),
        "not json",
        _line("streamed", "/v1/completions", {"prompt": "x", "stream": True}),
    ]
    code, results = _run(tmp_path, lines, "--max-concurrency", "2")
    assert code == 0
    assert [r["custom_id"] for r in results] == ["c0", "c1", "c2", "chat", "resp", "msg", "refused",
                                                 "too-long", None, "streamed"]
    assert len({r["id"] for r in results}) == len(results)
    ok = results[:6]
    assert all(r["response"]["status_code"] == 200 and r["error"] is None for r in ok)
    objects = [r["response"]["body"].get("object", r["response"]["body"].get("type")) for r in ok]
    assert objects == ["text_completion"] * 3 + ["chat.completion", "response", "message"]
    with LLM("qwen3-tiny", *ENGINE[2:-2]) as llm:
        expected = [g.text for g in llm.generate(prompts, SamplingParams(max_tokens=6, temperature=0.0,
                                                                          ignore_eos=True))]
    assert [r["response"]["body"]["choices"][0]["text"] for r in results[:3]] == expected
    for result, status, message in zip(results[6:], (400, 400, 400, 400),
                                       ("non-empty array of messages", "maximum context length is 512",
                                        "is not JSON", "cannot stream"), strict=True):
        assert result["response"]["status_code"] == status and message in result["error"]["message"], result
        assert result["error"]["code"] == "invalid_request_error"


def test_a_replica_killed_mid_batch_costs_no_line(tmp_path, monkeypatch):
    monkeypatch.setenv("CADENCE_INJECT_FAULT", "dp=1 tp=0 at=decode after=4")
    lines = [_line(f"r{i}", "/v1/completions", {"prompt": [i + 3] * (8 + i), "max_tokens": 12,
                                                "ignore_eos": True}) for i in range(24)]
    code, results = _run(tmp_path, lines, "--dp", "2")
    assert code == 0
    assert [r["custom_id"] for r in results] == [f"r{i}" for i in range(24)]
    failed = [r for r in results if r["response"]["status_code"] != 200]
    assert not failed, failed[:2]
    assert all(r["response"]["body"]["usage"]["completion_tokens"] == 12 for r in results)


def test_a_missing_input_file_fails_before_the_engine_starts(tmp_path, capsys):
    out = tmp_path / "o.jsonl"
    code = cli.main(["run-batch", "-i", str(tmp_path / "none.jsonl"), "-o", str(out), *ENGINE])
    assert code == 1
    assert "none.jsonl" in capsys.readouterr().err
    assert not out.exists()
