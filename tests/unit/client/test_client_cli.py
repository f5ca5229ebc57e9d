"""The command-line client and the chat REPL against a scripted tritonclient (no server)."""

import io

import bucketserve_client.client as client_module
import pytest
from bucketserve_client.chat import Conversation, chat_loop
from bucketserve_client.cli import build_parser, main, params_from_args
from bucketserve_client.client import Client
from bucketserve_client.params import GenerationParams

from tests.unit.client.client_fakes import FakeGrpcClient, FakeServer


@pytest.fixture
def server(monkeypatch):
    srv = FakeServer()
    monkeypatch.setattr(
        client_module.grpcclient, "InferenceServerClient", lambda url: FakeGrpcClient(srv)
    )
    return srv


def test_parser_maps_flags_to_params():
    a = build_parser().parse_args(
        [
            "generate",
            "q",
            "--max-tokens",
            "16",
            "--temperature",
            "0",
            "--top-p",
            "0.5",
            "--top-k",
            "4",
            "--seed",
            "7",
            "--stop",
            "A",
            "B",
            "--no-chat-template",
        ]
    )
    p = params_from_args(a)
    assert (p.max_tokens, p.temperature, p.top_p, p.top_k, p.seed) == (16, 0.0, 0.5, 4, 7)
    assert p.stop_words == ("A", "B") and not p.apply_chat_template


def test_chat_template_is_on_by_default_in_the_cli():
    assert params_from_args(build_parser().parse_args(["generate", "q"])).apply_chat_template


def test_generate_prints_the_answer(server, capsys):
    assert main(["generate", "q", "--max-tokens", "3", "--stats"]) == 0
    out, err = capsys.readouterr()
    assert out == "t0 t1 t2 \n" and "3 output tokens" in err


def test_generate_stream_prints_deltas(server, capsys):
    assert main(["generate", "q", "--stream"]) == 0
    assert capsys.readouterr().out == "t0 t1 t2 \n"
    assert server.requests[0][2]["stream"][0]


def test_server_error_exits_nonzero_with_the_message(server, capsys):
    server.error = "top_p must be in (0, 1], got 0.0"
    assert main(["generate", "q"]) == 1
    assert "error: top_p must be in (0, 1]" in capsys.readouterr().err


def test_invalid_value_exits_nonzero(capsys):
    assert main(["generate", "q", "--max-tokens", "0"]) == 1
    assert "max_tokens must be in [1," in capsys.readouterr().err


def test_usage_error_returns_2(capsys):
    assert main(["generate"]) == 2


class FakeTokenizer:
    name_or_path = "fake"

    def apply_chat_template(self, messages, tokenize, add_generation_prompt):
        return "|".join(f"{m['role']}:{m['content']}" for m in messages) + "|assistant:"


def lines(*items):
    it = iter(items)

    def read(_prompt):
        item = next(it)
        if isinstance(item, BaseException):
            raise item
        return item

    return read


def test_chat_keeps_the_conversation_with_a_tokenizer(server):
    conv = Conversation(FakeTokenizer())
    out = io.StringIO()
    code = chat_loop(
        Client(),
        GenerationParams(apply_chat_template=True),
        conv,
        lines("hello", "again", "/exit"),
        out,
    )
    assert code == 0 and "bot> t0 t1 t2 \n" in out.getvalue()
    second = server.requests[1][2]
    assert second["text_input"][0] == b"user:hello|assistant:t0 t1 t2 |user:again|assistant:"
    assert not second["apply_chat_template"][0]  # already templated here


def test_chat_without_tokenizer_sends_single_turns(server):
    chat_loop(
        Client(),
        GenerationParams(apply_chat_template=True),
        Conversation(),
        lines("hello", "/reset", "again", EOFError()),
        io.StringIO(),
    )
    assert server.requests[1][2]["text_input"][0] == b"again"
    assert server.requests[1][2]["apply_chat_template"][0]


class InterruptingClient:
    """stream() yields one chunk, then Ctrl-C arrives; records that the stream was closed."""

    def __init__(self):
        self.closed = False

    def stream(self, prompt, params):
        try:
            yield from Client().stream(prompt, params)
        finally:
            self.closed = True


def test_ctrl_c_cancels_the_answer_and_keeps_chatting(server):
    server.finish = False
    client = InterruptingClient()
    out = io.StringIO()

    def write_interrupting(text):
        if text.startswith("t1"):
            raise KeyboardInterrupt
        return io.StringIO.write(out, text)

    out.write = write_interrupting
    conv = Conversation(FakeTokenizer())
    code = chat_loop(client, GenerationParams(), conv, lines("hello", "/exit"), out)
    assert code == 0 and client.closed and "[cancelled]" in out.getvalue()
    assert conv.messages == []  # a cancelled turn is not kept
    assert server.requests[-1][2]["stop"][0]  # the ensemble got its stop request
