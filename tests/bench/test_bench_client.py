"""One streamed request against the in-process server: token counting, chunk
splitting, ITL arithmetic and every failure kind."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import httpx
import pytest

from kimidflash.bench.client import RequestRecord, chat_payload, split_itls, stream_chat

from ..support.fakeserver import FakeServer, Plan


def test_split_itls_spreads_a_multi_token_chunk_over_its_tokens() -> None:
    # first chunk 1 token at t=1.0; then 3 tokens at 1.3; then 1 token at 1.4; then 2 at 2.0
    itls = split_itls([(1.0, 1), (1.3, 3), (1.4, 1), (2.0, 2)])
    assert itls == pytest.approx([0.1, 0.1, 0.1, 0.1, 0.3, 0.3])
    assert len(itls) == 7 - 1 and sum(itls) == pytest.approx(2.0 - 1.0)


def test_split_itls_extra_tokens_in_the_first_chunk_arrive_with_it() -> None:
    assert split_itls([(5.0, 3), (5.5, 1)]) == pytest.approx([0.0, 0.0, 0.5])
    assert split_itls([(5.0, 0), (6.0, 1)]) == []  # a token-less chunk is not an interval
    assert split_itls([]) == []


def test_payload_asks_for_usage_and_token_ids() -> None:
    body = chat_payload("m", [{"role": "user", "content": "hi"}], 7, 0.0)
    assert body["stream"] is True and body["max_tokens"] == 7 and body["temperature"] == 0.0
    assert body["stream_options"] == {"include_usage": True, "continuous_usage_stats": True}
    assert body["return_token_ids"] is True
    plain = chat_payload("m", [], 7, 0.5, vllm_extensions=False, ignore_eos=True)
    assert plain["stream_options"] == {"include_usage": True} and "return_token_ids" not in plain
    assert plain["ignore_eos"] is True


@pytest.fixture
def server() -> Iterator[FakeServer]:
    s = FakeServer(spec_tokens=3).start()
    yield s
    s.stop()


def one(
    server: FakeServer, plan: Plan, *, extensions: bool = True, max_tokens: int = 64, timeout: float = 5.0
) -> RequestRecord:
    server._plan = plan

    async def go() -> RequestRecord:
        async with httpx.AsyncClient() as client:
            rec = RequestRecord(session=0, turn=0, due=time.perf_counter())
            body = chat_payload(server.model, [{"role": "user", "content": "a b c"}], max_tokens, 0.0, extensions)
            return await stream_chat(client, server.base_url + "/chat/completions", body, {}, rec, timeout)

    return asyncio.run(go())


def test_token_ids_split_multi_token_chunks(server: FakeServer) -> None:
    rec = one(server, Plan(chunks=(1, 3, 2, 4), first_delay=0.05, delay=0.03))
    assert rec.ok and rec.error is None
    assert rec.output_tokens == 10 and rec.prompt_tokens == 3
    assert rec.token_source == "token_ids"
    assert [n for _, n in rec.chunks] == [1, 3, 2, 4]  # the role-only chunk is not a token chunk
    itls = rec.itls
    assert len(itls) == 9
    assert sum(itls) == pytest.approx(rec.chunks[-1][0] - rec.chunks[0][0])
    # the 3-token chunk's interval is split three ways, equal
    assert itls[0] == pytest.approx(itls[1]) == pytest.approx(itls[2])
    assert itls[0] == pytest.approx((rec.chunks[1][0] - rec.chunks[0][0]) / 3)
    assert rec.ttft is not None and rec.ttft >= 0.05
    assert rec.e2el is not None and rec.e2el >= 0.05 + 3 * 0.03
    assert rec.tpot == pytest.approx((rec.e2el - rec.ttft) / 9)
    assert rec.text.startswith("t1000 ") and rec.finish_reason == "length"


def test_usage_deltas_count_tokens_without_token_ids(server: FakeServer) -> None:
    rec = one(server, Plan(chunks=(2, 3, 1), send_token_ids=False))
    assert rec.ok and rec.token_source == "usage"
    assert [n for _, n in rec.chunks] == [2, 3, 1] and rec.output_tokens == 6
    assert len(rec.itls) == 5


def test_without_extensions_chunks_are_counted_and_marked(server: FakeServer) -> None:
    rec = one(server, Plan(chunks=(2, 3, 1)), extensions=False)
    assert rec.ok and rec.token_source == "chunks"
    assert rec.output_tokens == 6  # the total still comes from usage, not from chunks
    assert rec.chunk_token_total == 3


@pytest.mark.parametrize("usage_on", ["last_chunk", "finish_chunk"])
def test_a_final_usage_total_is_never_booked_onto_one_chunk(server: FakeServer, usage_on: str) -> None:
    # 24 tokens in 10 text chunks; the server sends usage once, with the total, on
    # the last content chunk or on a finish-only chunk (no continuous usage stats).
    sizes = (3, 3, 3, 3, 2, 2, 2, 2, 2, 2)
    rec = one(server, Plan(chunks=sizes, delay=0.01, usage_on=usage_on), extensions=False)
    assert rec.ok and rec.output_tokens == 24  # the total still comes from usage
    assert rec.token_source == "chunks"  # per-chunk counts are not known, and the record says so
    assert [n for _, n in rec.chunks] == [1] * 10
    assert len(rec.itls) == 9  # one interval per gap between content chunks
    assert sum(rec.itls) == pytest.approx(rec.chunks[-1][0] - rec.chunks[0][0])


def test_usage_on_every_chunk_still_gives_per_chunk_counts(server: FakeServer) -> None:
    rec = one(server, Plan(chunks=(2, 3, 1), send_token_ids=False, usage_on="finish_chunk"))
    assert rec.ok and rec.token_source == "usage"
    assert [n for _, n in rec.chunks] == [2, 3, 1] and rec.output_tokens == 6


def test_max_tokens_is_honoured_and_counted(server: FakeServer) -> None:
    rec = one(server, Plan(chunks=(4,) * 10), max_tokens=9)
    assert rec.output_tokens == 9 and rec.chunk_token_total == 9


@pytest.mark.parametrize(
    "plan, kind",
    [
        (Plan(fault="http_500"), "http_500"),
        (Plan(fault="disconnect", fault_after=2), "disconnect"),
        (Plan(fault="error_event", fault_after=1), "server_error_event"),
        (Plan(fault="no_usage"), "no_usage"),
    ],
)
def test_faults_become_error_kinds(server: FakeServer, plan: Plan, kind: str) -> None:
    rec = one(server, plan)
    assert not rec.ok and rec.error == kind and rec.error_detail


def test_a_hung_stream_times_out(server: FakeServer) -> None:
    t = time.perf_counter()
    rec = one(server, Plan(fault="hang", fault_after=1), timeout=0.5)
    assert rec.error == "timeout" and time.perf_counter() - t < 3
    assert rec.first_token is not None  # what was measured before the hang is kept


def test_unknown_model_and_refused_connection() -> None:
    s = FakeServer().start()
    port = s.port
    try:

        async def go(model: str) -> RequestRecord:
            async with httpx.AsyncClient() as c:
                rec = RequestRecord(0, 0, time.perf_counter())
                return await stream_chat(
                    c, f"http://127.0.0.1:{port}/v1/chat/completions", chat_payload(model, [], 4, 0.0), {}, rec, 5
                )

        assert asyncio.run(go("nope")).error == "http_404"
    finally:
        s.stop()
    assert asyncio.run(go("fake-model")).error == "connect"


def test_events_split_across_reads_and_crlf_lines_are_framed_whole() -> None:
    """SSE framing is ours (on bytes): an event cut anywhere by the network, CRLF
    line ends, comments and `event:` lines must not change what is counted."""
    events = [
        b": keep-alive comment",
        b"event: message",
        b'data: {"choices":[{"delta":{"role":"assistant"}}],"prompt_token_ids":[7,8,9,10,11]}',
        b'data: {"choices":[{"delta":{"content":"He"},"token_ids":[1,2]}]}',
        b'data: {"choices":[{"delta":{"content":"llo"},"token_ids":[3],"finish_reason":"length"}]}',
        b'data: {"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":3}}',
        b"data: [DONE]",
    ]
    raw = b"".join(e + b"\r\n\r\n" for e in events)

    async def pieces():
        for i in range(0, len(raw), 7):  # cuts land inside JSON, inside "data:", between \r and \n
            yield raw[i : i + 7]

    async def go() -> RequestRecord:
        transport = httpx.MockTransport(lambda request: httpx.Response(200, content=pieces()))
        async with httpx.AsyncClient(transport=transport) as client:
            return await stream_chat(
                client,
                "http://test/v1/chat/completions",
                {},
                {},
                RequestRecord(session=0, turn=0, due=time.perf_counter()),
                5.0,
            )

    rec = asyncio.run(go())
    assert rec.ok, rec.error_detail
    assert (rec.text, rec.output_tokens, rec.prompt_tokens, rec.finish_reason) == ("Hello", 3, 5, "length")
    assert [n for _, n in rec.chunks] == [2, 1] and rec.token_source == "token_ids"
    # the ids themselves, in order (what FP8 validation compares token by token)
    assert (rec.prompt_token_ids, rec.token_ids) == ([7, 8, 9, 10, 11], [1, 2, 3])
