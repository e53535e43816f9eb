"""Tools on the remote engine, against a real local HTTP server that streams scripted replies the
way llama-server and vLLM do (`delta.tool_calls` fragments keyed by `index`, the arguments' JSON
cut anywhere) and records every request body, so both directions are checked on the wire."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from velo_chat.engine.config.profiles import build_profile
from velo_chat.engine.events import EngineWarning, TokenDelta, TurnDone, TurnFailed
from velo_chat.engine.prompt.chat_template import ChatMessage
from velo_chat.engine.remote.engine import RemoteEngine, request_body
from velo_chat.engine.remote.tools import CUT
from velo_chat.engine.tools.types import ToolCall, ToolSpec

pytest.importorskip("openai")
MODEL = "tool-model"
READ = ToolSpec(
    "read_file",
    "Read a file of the working folder.",
    {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]},
)
SEARCH = ToolSpec(
    "search",
    "Search the working folder for a regular expression.",
    {"type": "object", "properties": {"pattern": {"type": "string"}}, "required": ["pattern"]},
)
TOOLS = (READ, SEARCH)


def choice(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    return {
        "object": "chat.completion.chunk",
        "model": MODEL,
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }


def frag(
    index: int, arguments: str | None = None, *, id: str | None = None, name: str | None = None
) -> dict[str, Any]:
    """One `delta.tool_calls` fragment, as servers send them: id, type and name on the first."""
    out: dict[str, Any] = {"index": index}
    if id is not None:
        out.update(id=id, type="function")
    function: dict[str, Any] = {}
    if name is not None:
        function["name"] = name
    if arguments is not None:
        function["arguments"] = arguments
    out["function"] = function
    return out


def calls(*fragments: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    return choice({"tool_calls": list(fragments)}, finish)


USAGE = {"choices": [], "usage": {"prompt_tokens": 40, "completion_tokens": 21, "total_tokens": 61}}

# What each path streams. Two calls whose fragments interleave, the arguments cut mid-string and
# mid-escape, text before them: llama-server's shape with finish_reason "tool_calls".
SCRIPTS: dict[str, list[dict[str, Any]]] = {
    "two": [
        choice({"role": "assistant", "content": "Let me look."}),
        calls(frag(0, "", id="call_a", name="read_file")),
        calls(frag(0, '{"pa')),
        calls(frag(0, 'th": "docs/RE')),
        calls(frag(1, '{"pattern": ', id="call_b", name="search")),
        calls(frag(0, 'MOTE.md"}')),
        calls(frag(1, '"tool_\\')),
        calls(frag(1, 'u0063alls"}')),
        choice({}, "tool_calls"),
        USAGE,
    ],
    # each fragment wrong in its own way; the stream itself is fine
    "bad": [
        calls(frag(0, '{"path": "READ', id="c0", name="read_file")),
        calls(frag(1, '["a", "b"]', id="c1", name="search")),
        calls(frag(2, '{"path": "x"}', id="c2")),
        calls(frag(3, '{"cmd": "rm -rf /"}', id="c3", name="run_anything")),
        calls(frag(4, "", id="c4", name="search")),
        choice({}, "tool_calls"),
    ],
    "plain": [choice({"content": "No tools needed."}), choice({}, "stop")],
}
CUT_SCRIPT = [calls(frag(0, '{"path": "docs/', id="call_cut", name="read_file"))]


class ToolServer:
    """`http://127.0.0.1:PORT/<script>/v1`: lists MODEL, streams SCRIPTS[script] for a chat
    request (`cut`: one fragment, then the connection drops), and keeps each request body."""

    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                data = json.dumps({"object": "list", "data": [{"id": MODEL, "object": "model"}]}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_POST(self) -> None:
                server.bodies.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
                script = self.path.strip("/").split("/", 1)[0]
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                for chunk in CUT_SCRIPT if script == "cut" else SCRIPTS[script]:
                    self._send(f"data: {json.dumps(chunk)}\n\n".encode())
                if script == "cut":
                    self.connection.shutdown(socket.SHUT_RDWR)
                    return
                self._send(b"data: [DONE]\n\n")
                self.wfile.write(b"0\r\n\r\n")

            def _send(self, data: bytes) -> None:
                self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
                self.wfile.flush()

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)

    def url(self, script: str) -> str:
        return f"http://127.0.0.1:{self._httpd.server_address[1]}/{script}/v1"

    def __enter__(self) -> ToolServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()


@pytest.fixture(scope="module")
def server() -> Iterator[ToolServer]:
    with ToolServer() as s:
        yield s


def engine_for(server: ToolServer, script: str) -> RemoteEngine:
    profile = build_profile(
        "r", {"backend": {"kind": "remote", "base_url": server.url(script), "model": MODEL, "max_retries": 0}}
    )
    engine = RemoteEngine(profile)
    engine.load()
    return engine


def run(engine: RemoteEngine, messages: list[ChatMessage], **kwargs: Any) -> list[Any]:
    with engine.turn(messages, **kwargs) as turn:
        return list(turn)


# An earlier step: the model called read_file (its arguments as a server streamed them, spaces
# and all), and the tool answered.
EARLIER = ToolCall("read_file", {"path": "a.txt"}, id="call_0", text='{"path":  "a.txt"}')
HISTORY = [
    ChatMessage("system", "You edit code."),
    ChatMessage("user", "What is in a.txt?"),
    ChatMessage("assistant", "", reasoning_content="I should read it.", tool_calls=(EARLIER,)),
    ChatMessage("tool", "hello", tool_call_id="call_0", name="read_file"),
    ChatMessage("user", "And the docs?"),
]


def test_split_tool_call_fragments_become_calls_and_the_request_carries_tools(server):
    with engine_for(server, "two") as engine:
        assert engine.tool_format() == "openai"
        assert engine.preview(HISTORY, tools=TOOLS).source == "server"
        events = run(engine, HISTORY, tools=TOOLS, tool_choice="required")
    done = events[-1]
    assert isinstance(done, TurnDone)
    assert done.text == "Let me look." and done.stats.finish_reason == "stop"
    assert [e.text for e in events if isinstance(e, TokenDelta)] == ["Let me look."]
    assert done.tool_calls == (
        ToolCall("read_file", {"path": "docs/REMOTE.md"}, id="call_a", text='{"path": "docs/REMOTE.md"}'),
        ToolCall("search", {"pattern": "tool_calls"}, id="call_b", text='{"pattern": "tool_\\u0063alls"}'),
    )
    assert done.stats.decode_tokens == 21 and done.stats.ttft_s > 0

    body = server.bodies[-1]
    assert body["tools"] == [READ.template_dict(), SEARCH.template_dict()]
    assert body["tools"][0]["function"]["parameters"]["required"] == ["path"]
    assert body["tool_choice"] == "required"
    assert body["messages"] == [
        {"role": "system", "content": "You edit code."},
        {"role": "user", "content": "What is in a.txt?"},
        {
            "role": "assistant",
            "content": "",
            "reasoning_content": "I should read it.",
            "tool_calls": [
                {
                    "id": "call_0",
                    "type": "function",
                    # the arguments exactly as the server streamed them: its prompt cache matches
                    "function": {"name": "read_file", "arguments": '{"path":  "a.txt"}'},
                }
            ],
        },
        {"role": "tool", "content": "hello", "tool_call_id": "call_0", "name": "read_file"},
        {"role": "user", "content": "And the docs?"},
    ]
    assert body["stream"] is True and body["cache_prompt"] is True  # the rest as before


def test_the_calls_a_reply_made_go_back_to_the_server_as_they_came(server):
    """A step's calls (from the turn before) and their results, sent back in the next request."""
    with engine_for(server, "two") as engine:
        first = run(engine, [ChatMessage("user", "Look at the docs.")], tools=TOOLS)[-1]
        step = [
            ChatMessage("user", "Look at the docs."),
            ChatMessage("assistant", first.text, tool_calls=first.tool_calls),
            ChatMessage("tool", "# Remote", tool_call_id="call_a", name="read_file"),
            ChatMessage("tool", "docs/remote.md:3", tool_call_id="call_b", name="search"),
        ]
        run(engine, step, tools=TOOLS)
    body = server.bodies[-1]
    assert body["tool_choice"] == "auto"
    sent = body["messages"][1]
    assert sent["content"] == "Let me look."
    assert [(c["id"], c["function"]["name"], c["function"]["arguments"]) for c in sent["tool_calls"]] == [
        ("call_a", "read_file", '{"path": "docs/REMOTE.md"}'),
        ("call_b", "search", '{"pattern": "tool_\\u0063alls"}'),
    ]
    assert [(m["role"], m["tool_call_id"]) for m in body["messages"][2:]] == [
        ("tool", "call_a"),
        ("tool", "call_b"),
    ]


def test_malformed_calls_come_back_with_an_error_and_the_turn_ends_normally(server):
    with engine_for(server, "bad") as engine:
        done = run(engine, [ChatMessage("user", "Go.")], tools=TOOLS)[-1]
    assert isinstance(done, TurnDone) and done.stats.finish_reason == "stop" and done.text == ""
    by_id = {c.id: c for c in done.tool_calls}
    assert list(by_id) == ["c0", "c1", "c2", "c3", "c4"]
    assert by_id["c0"].error.startswith("the arguments are not valid JSON")
    assert by_id["c0"].arguments == {} and by_id["c0"].text == '{"path": "READ'  # kept as streamed
    assert by_id["c1"].error == "the arguments are not a JSON object (got list)"
    assert by_id["c2"].error == "the call names no tool" and by_id["c2"].name == ""
    assert by_id["c3"].error == "no tool named 'run_anything' was offered"
    assert by_id["c3"].arguments == {"cmd": "rm -rf /"}
    # no arguments at all: a call of a tool that takes none, not an error
    assert (by_id["c4"].error, by_id["c4"].arguments, by_id["c4"].name) == ("", {}, "search")


def test_a_stream_cut_inside_a_call_keeps_the_call_marked_incomplete(server):
    with engine_for(server, "cut") as engine:
        events = run(engine, [ChatMessage("user", "Go.")], tools=TOOLS)
    assert not any(isinstance(e, TurnFailed) for e in events)
    assert any(isinstance(e, EngineWarning) and "the reply was cut" in e.message for e in events)
    done = events[-1]
    assert isinstance(done, TurnDone) and done.stats.finish_reason == "interrupted"
    (call,) = done.tool_calls
    assert (call.id, call.name, call.text, call.error) == ("call_cut", "read_file", '{"path": "docs/', CUT)


def test_without_tools_the_request_is_as_before(server):
    with engine_for(server, "plain") as engine:
        done = run(engine, [ChatMessage("user", "Hi")])[-1]
        run(engine, [ChatMessage("user", "Hi")], tool_choice="none")
    assert done.text == "No tools needed." and done.tool_calls == ()
    for body in server.bodies[-2:]:
        assert "tools" not in body and "tool_choice" not in body
        assert body["messages"] == [{"role": "user", "content": "Hi"}]


def test_tool_choice_none_still_describes_the_tools(server):
    with engine_for(server, "plain") as engine:
        done = run(engine, [ChatMessage("user", "Hi")], tools=[READ], tool_choice="none")[-1]
    assert done.tool_calls == ()
    assert server.bodies[-1]["tool_choice"] == "none" and server.bodies[-1]["tools"] == [READ.template_dict()]


def test_an_unknown_tool_choice_is_refused_before_any_request(server):
    with engine_for(server, "plain") as engine:
        sent = len(server.bodies)
        with pytest.raises(ValueError, match="tools.choice must be one of auto, required, none"):
            engine.turn([ChatMessage("user", "Hi")], tools=TOOLS, tool_choice="any")
    assert len(server.bodies) == sent


def test_calls_stored_without_ids_get_ids_their_results_share():
    """A step from a model whose own format has no call ids (read in this process, continued on
    a server): each call gets an id from its place, and the results after it take them in order."""
    profile = build_profile("r", {"backend": {"kind": "remote", "base_url": "http://127.0.0.1:1/v1"}})
    step = (ToolCall("read_file", {"path": "a"}, text="<call>a</call>"), ToolCall("search", {"pattern": "b"}))
    messages = [
        ChatMessage("user", "Go."),
        ChatMessage("assistant", "", tool_calls=step),
        ChatMessage("tool", "A", name="read_file"),
        ChatMessage("tool", "B", name="search"),
    ]
    body = request_body(profile, "m", messages, profile.sampling, profile.reasoning, tools=TOOLS)
    sent = body["messages"]
    assert [c["id"] for c in sent[1]["tool_calls"]] == ["call_1_0", "call_1_1"]
    # a call's text in a model's own format is not JSON: its arguments go as compact JSON
    assert [c["function"]["arguments"] for c in sent[1]["tool_calls"]] == ['{"path":"a"}', '{"pattern":"b"}']
    assert [m["tool_call_id"] for m in sent[2:]] == ["call_1_0", "call_1_1"]
