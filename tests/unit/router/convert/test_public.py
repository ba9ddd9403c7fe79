"""The public service's messages at its edge: a GenerateRequest's prompt oneof becomes one of
text, token ids or Chat (unset flags true), and a ResponseChunk goes out with usage and
timings only where it carries them."""

from __future__ import annotations

from tandem.protos.v1 import tandem_pb2
from tandem.router.api.chat import Chat, ChatMessage
from tandem.router.api.response import ModelInfo, ResponseChunk, Timings, Usage
from tandem.router.api.sampling import LogprobOptions
from tandem.router.convert.public import (
    generate_request_from_proto,
    models_to_proto,
    response_to_proto,
    tokenize_request_from_proto,
    tokenize_response_to_proto,
)
from tandem.router.tools.call import CallDelta, ToolCall


def test_each_prompt_form_and_the_labels() -> None:
    text = generate_request_from_proto(tandem_pb2.GenerateRequest(
        text="hi", model="m", request_id="r-1", user="u",
        logprobs=tandem_pb2.LogprobOptions(enabled=True, top_logprobs=2)))
    assert (text.prompt, text.kind, text.model, text.request_id, text.user) == (
        "hi", "text", "m", "r-1", "u")
    assert text.logprobs == LogprobOptions(True, 2)
    ids = generate_request_from_proto(
        tandem_pb2.GenerateRequest(token_ids=tandem_pb2.TokenIds(ids=[1, 2])))
    assert (ids.prompt, ids.kind) == ((1, 2), "token_ids")
    empty_ids = generate_request_from_proto(
        tandem_pb2.GenerateRequest(token_ids=tandem_pb2.TokenIds()))
    assert (empty_ids.prompt, empty_ids.kind) == ((), "token_ids")  # given, though empty
    none = generate_request_from_proto(tandem_pb2.GenerateRequest())
    assert none.prompt is None and none.kind is None


def test_a_chat_keeps_its_messages_calls_and_flags() -> None:
    message = tandem_pb2.GenerateRequest(chat=tandem_pb2.ChatMessages(
        messages=[
            tandem_pb2.ChatMessage(role="assistant", tool_calls=[
                tandem_pb2.ToolCall(id="c1", name="f", arguments="{}")]),
            tandem_pb2.ChatMessage(role="tool", content="4", name="f", tool_call_id="c1"),
        ],
        tools_json="[]", tool_choice="required"))
    chat = generate_request_from_proto(message).prompt
    assert chat == Chat(
        (ChatMessage("assistant", tool_calls=(ToolCall("c1", "f", "{}"),)),
         ChatMessage("tool", "4", name="f", tool_call_id="c1")),
        add_generation_prompt=True, tools_json="[]", tool_choice="required",
        parallel_tool_calls=True)
    message.chat.add_generation_prompt = False
    message.chat.parallel_tool_calls = False
    chat = generate_request_from_proto(message).prompt
    assert isinstance(chat, Chat)
    assert not chat.add_generation_prompt and not chat.parallel_tool_calls


def test_tokenize_requests() -> None:
    text = tokenize_request_from_proto(
        tandem_pb2.TokenizeRequest(text="", model="m", add_special_tokens=True))
    assert (text.text, text.chat, text.model, text.add_special_tokens) == ("", None, "m", True)
    neither = tokenize_request_from_proto(tandem_pb2.TokenizeRequest())
    assert neither.text is None and neither.chat is None
    chat = tokenize_request_from_proto(tandem_pb2.TokenizeRequest(
        chat=tandem_pb2.ChatMessages(messages=[tandem_pb2.ChatMessage(role="user", content="x")])))
    assert chat.text is None and chat.chat == Chat((ChatMessage("user", "x"),))
    assert tokenize_response_to_proto([4, 5]) == tandem_pb2.TokenizeResponse(
        token_ids=[4, 5], count=2)


def test_a_response_chunk_goes_out_with_only_what_it_carries() -> None:
    middle = response_to_proto(ResponseChunk(
        "r", token_ids=(5,), text="a", index=2,
        tool_call_deltas=(CallDelta(0, "c", "f", ""), CallDelta(0, None, None, "{}"))))
    assert not middle.HasField("usage") and not middle.HasField("timings")
    assert (list(middle.token_ids), middle.text, middle.index) == ([5], "a", 2)
    assert [(d.index, d.id, d.name, d.arguments) for d in middle.tool_call_deltas] == [
        (0, "c", "f", ""), (0, "", "", "{}")]
    last = response_to_proto(ResponseChunk(
        "r", finished=True, finish_reason="tool_calls", stop_reason="\n",
        usage=Usage(3, 2, 1), timings=Timings(0.1, 0.2, 0.3, 0.4, 0.5, 0.6),
        tool_calls=(ToolCall("c", "f", "{}"),)))
    assert last.finished and (last.finish_reason, last.stop_reason) == ("tool_calls", "\n")
    assert last.usage == tandem_pb2.Usage(prompt_tokens=3, completion_tokens=2, cached_tokens=1)
    assert last.timings == tandem_pb2.Timings(queue_s=0.1, prefill_s=0.2, transfer_s=0.3,
                                              first_token_s=0.4, decode_s=0.5, total_s=0.6)
    assert [(c.id, c.name, c.arguments) for c in last.tool_calls] == [("c", "f", "{}")]


def test_models() -> None:
    out = models_to_proto([ModelInfo("m", 2048, weights_format="Q8_0 x1")])
    assert out == tandem_pb2.ListModelsResponse(models=[tandem_pb2.ModelInfo(
        id="m", max_model_len=2048, owned_by="tandem", weights_format="Q8_0 x1")])
