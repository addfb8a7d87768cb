"""What a request asks for besides its messages: free text, or the structured forms coding
agents send (`--workload`, and the sweep's `workload` client setting).

Each workload turns the same prompt into its kind of request, so a run of each on the same
prompts, against the same server, measures what the constraint costs speculation:

- ``free``: plain chat, the default.
- ``json``: ``response_format`` with a JSON schema: a short title and the answer.
- ``tools``: one strict function tool, named in ``tool_choice`` (the server needs a
  tool-call parser: TOOL_CALL_PARSER); its arguments carry the reply.
- ``envelope``: a coding agent's reply: a JSON object with a short header (path,
  language, one-line summary) around one long ``content`` string, the file or diff.

A structured reply is checked against its schema when it is complete (finish_reason
``stop``, or ``tool_calls``); a reply cut off at max_tokens is counted apart, since the
grammar never got to close it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

ANSWER = {
    "type": "object",
    "additionalProperties": False,
    "required": ["title", "answer"],
    "properties": {"title": {"type": "string", "maxLength": 80}, "answer": {"type": "string"}},
}
ENVELOPE = {
    "type": "object",
    "additionalProperties": False,
    "required": ["path", "language", "summary", "content"],
    "properties": {
        "path": {"type": "string", "maxLength": 120},
        "language": {"type": "string", "enum": ["python", "javascript", "shell", "diff", "text"]},
        "summary": {"type": "string", "maxLength": 200},
        "content": {"type": "string"},
    },
}
TOOL = "reply"
# Why --ignore-eos is refused with a structured workload (the benchmark's and the sweep's checks).
NO_IGNORE_EOS = (
    "a structured reply ends where its grammar does, and generating past it measures nothing the workload asks for"
)


@dataclass(frozen=True)
class Workload:
    name: str
    what: str
    instruction: str = ""  # appended to every user turn
    fields: dict[str, Any] = field(default_factory=dict)  # request fields besides the messages
    schema: dict[str, Any] | None = None  # what a complete reply (or the tool's arguments) must satisfy

    @property
    def structured(self) -> bool:
        return self.schema is not None

    def user(self, text: str) -> str:
        return f"{text}\n\n{self.instruction}" if self.instruction else text

    def problem(self, text: str, tool_calls: list[dict[str, str]], finish_reason: str | None) -> str | None:
        """Why a finished reply is not what the workload asked for, or None. jsonschema is imported
        here, not at the top: the benchmark package is imported by the training command too, which
        runs on GPU nodes that have no jsonschema."""
        if not self.structured:
            return None
        if finish_reason == "length":
            return "cut off at max_tokens"
        if self.name == "tools":
            if len(tool_calls) != 1 or tool_calls[0].get("name") != TOOL:
                return f"expected one call of {TOOL}, got {[c.get('name') for c in tool_calls]}"
            text = tool_calls[0].get("arguments") or ""
        import jsonschema

        try:
            doc = json.loads(text)
        except json.JSONDecodeError as e:
            return f"not JSON: {e.msg} at {e.pos}"
        try:
            jsonschema.validate(doc, self.schema)
        except jsonschema.ValidationError as e:
            return f"breaks the schema: {e.message[:200]}"
        return None


def _response_format(name: str, schema: dict[str, Any]) -> dict[str, Any]:
    return {"response_format": {"type": "json_schema", "json_schema": {"name": name, "schema": schema, "strict": True}}}


WORKLOADS: dict[str, Workload] = {
    w.name: w
    for w in (
        Workload("free", "plain chat"),
        Workload(
            "json",
            "response_format json_schema: a title and the answer",
            'Reply as a JSON object with a short "title" and the full "answer".',
            _response_format("answer", ANSWER),
            ANSWER,
        ),
        Workload(
            "tools",
            f"one strict function tool ({TOOL}), named in tool_choice",
            f'Send your reply by calling {TOOL} with a short "title" and the full "answer".',
            {
                "tools": [
                    {
                        "type": "function",
                        "function": {
                            "name": TOOL,
                            "description": "Send the reply to the user.",
                            "parameters": ANSWER,
                            "strict": True,
                        },
                    }
                ],
                "tool_choice": {"type": "function", "function": {"name": TOOL}},
                "parallel_tool_calls": False,
            },
            ANSWER,
        ),
        Workload(
            "envelope",
            "a coding agent's JSON envelope: path, language, summary and one long content string",
            'Reply as a JSON object for a coding agent: the "path" of the file to write, its "language", a '
            'one-line "summary", and the whole file in "content".',
            _response_format("edit", ENVELOPE),
            ENVELOPE,
        ),
    )
}


def workload(name: str) -> Workload:
    """The workload by name; ValueError lists the known ones."""
    try:
        return WORKLOADS[name]
    except KeyError:
        raise ValueError(f"unknown workload {name!r}; known: {', '.join(WORKLOADS)}") from None
