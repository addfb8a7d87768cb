"""A scripted OpenAI-compatible server for the self-synthesis tests: user turns by seed, greedy
answers by content, each filter's culprit among them, over a real socket (the client's concurrency
and pipelining only show over TCP)."""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from kimidflash.train.selfsynth import Settings, Template, synthesize

EVAL = "def truncate_number(number: float) -> float: given a positive floating point number it can be decomposed into"

USERS = [
    "How do I write a SQL query that joins two tables and counts rows?",
    "Plan a weekend trip to the mountains with a tight budget for two people.",
    "ok",  # too short
    "Объясните, как работает фотосинтез у растений",  # not Latin script
    f"Please help: {EVAL} and so on",  # contaminated
    "What are three tips for staying resilient when a project fails?",
    "How do I write a SQL query that joins two tables and counts rows?",  # exact duplicate
    "Explain how homemade ice cream gets smooth without an ice cream machine at all.",
]


# Chat templates as text, SmolLM2-like and Kimi-like, rendered by `jinja`
SMOL = (
    "{% for m in messages %}{% if loop.first and m['role'] != 'system' %}<|im_start|>system\nYou are a helpful "
    "AI assistant<|im_end|>\n{% endif %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
)
KIMI = (
    "{% for m in messages %}<|im_{{ m['role'] }}|>{{ m['role'] }}<|im_middle|>{{ m['content'] }}<|im_end|>{% endfor %}"
)


def jinja(template: str):
    import jinja2

    t = jinja2.Template(template)
    return lambda messages: t.render(messages=messages)


class Scripted(BaseHTTPRequestHandler):
    """User turn by seed (the list above, cycled; seed 5 of each cycle hits max_tokens), a greedy answer
    by content (one answer caught in a loop)."""

    def log_message(self, *args):
        pass

    bodies: list[dict] = []  # every request, in arrival order (the tests that read it clear it first)
    done: list[str] = []  # "user" or "answer" as each reply is sent
    slow_user = 0.0  # seconds the last user turn of each cycle takes

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        Scripted.bodies.append(body)
        if self.path == "/v1/completions":
            assert body["prompt"].endswith("<|im_start|>user\n") and body["stop"] == ["<|im_end|>"]
            i = body["seed"] % 9
            if i == 8:
                time.sleep(Scripted.slow_user)
            text, finish = (USERS[i], "stop") if i < len(USERS) else ("and then and then", "length")
            out = {"choices": [{"text": " " + text, "finish_reason": finish}], "usage": {"completion_tokens": 12}}
        else:
            assert body["temperature"] == 0.0 and body["return_token_ids"]
            content = body["messages"][0]["content"]
            answer = "loop loop loop loop loop loop" if "resilient" in content else f"Here is how: {content[:20]}"
            out = {
                "prompt_token_ids": [1, 2, 3, len(content)],
                "choices": [{"message": {"content": answer}, "token_ids": [7, 8, 9], "finish_reason": "stop"}],
            }
        data = json.dumps(out).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
        Scripted.done.append("user" if self.path == "/v1/completions" else "answer")


@contextlib.contextmanager
def scripted_server() -> Iterator[str]:
    """`Scripted` on a free port, for as long as the block runs; yields its base URL."""
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Scripted)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()


TEMPLATE = Template("<|im_start|>system\nYou are a helpful AI assistant<|im_end|>\n<|im_start|>user\n", "<|im_end|>")


def run(server: str, out: Path, shards: int, template: Template | None = None, **over) -> dict:
    settings = Settings("smollm2", per_shard=9, **over)
    return synthesize(
        server, out, template or TEMPLATE, settings, shards, {"evals": [EVAL]}, concurrency=4, log=lambda m: None
    )


MULTI = Template(
    TEMPLATE.prefix, TEMPLATE.stop, "<|im_end|>\n<|im_start|>assistant\n", "<|im_end|>\n<|im_start|>user\n"
)
