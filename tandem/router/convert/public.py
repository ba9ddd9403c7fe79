"""The public ``tandem.v1.Tandem`` service's messages <-> tandem/router/api types.

    GenerateRequest  -> api.GenerateRequest      (its prompt oneof -> str | ids | Chat)
    TokenizeRequest  -> api.TokenizeRequest
    api.ResponseChunk -> GenerateResponse        (usage and timings only where set)
    token ids         -> TokenizeResponse
    api.ModelInfo     -> ListModelsResponse
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from tandem.protos.v1 import tandem_pb2
from tandem.router.api.chat import Chat, ChatMessage
from tandem.router.api.request import GenerateRequest, Prompt, TokenizeRequest
from tandem.router.api.response import ModelInfo, ResponseChunk
from tandem.router.convert.sampling import (
    logprob_options_from_proto,
    sampling_from_proto,
    token_logprobs_to_proto,
)
from tandem.router.tools.call import ToolCall


def generate_request_from_proto(request: tandem_pb2.GenerateRequest) -> GenerateRequest:
    """A client's GenerateRequest."""
    return GenerateRequest(
        prompt=_prompt(request),
        sampling=sampling_from_proto(request.sampling),
        logprobs=logprob_options_from_proto(request.logprobs),
        model=request.model,
        request_id=request.request_id,
        user=request.user,
    )


def _prompt(request: tandem_pb2.GenerateRequest) -> Prompt | None:
    kind = request.WhichOneof("prompt")
    if kind == "text":
        return request.text
    if kind == "token_ids":
        return tuple(request.token_ids.ids)
    if kind == "chat":
        return chat_from_proto(request.chat)
    return None


def chat_from_proto(chat: tandem_pb2.ChatMessages) -> Chat:
    """A client's ChatMessages (its unset flags: true)."""
    return Chat(
        messages=tuple(
            ChatMessage(
                role=m.role, content=m.content, name=m.name, tool_call_id=m.tool_call_id,
                tool_calls=tuple(ToolCall(c.id, c.name, c.arguments) for c in m.tool_calls),
            )
            for m in chat.messages
        ),
        add_generation_prompt=(chat.add_generation_prompt
                               if chat.HasField("add_generation_prompt") else True),
        tools_json=chat.tools_json,
        tool_choice=chat.tool_choice,
        parallel_tool_calls=(chat.parallel_tool_calls
                             if chat.HasField("parallel_tool_calls") else True),
    )


def tokenize_request_from_proto(request: tandem_pb2.TokenizeRequest) -> TokenizeRequest:
    """A client's TokenizeRequest."""
    kind = request.WhichOneof("input")
    return TokenizeRequest(
        text=request.text if kind == "text" else None,
        chat=chat_from_proto(request.chat) if kind == "chat" else None,
        model=request.model,
        add_special_tokens=request.add_special_tokens,
    )


def response_to_proto(chunk: ResponseChunk) -> tandem_pb2.GenerateResponse:
    """One message of a generation, as the client is sent it."""
    out = tandem_pb2.GenerateResponse(
        request_id=chunk.request_id,
        token_ids=chunk.token_ids,
        text=chunk.text,
        logprobs=token_logprobs_to_proto(chunk.logprobs),
        finished=chunk.finished,
        finish_reason=chunk.finish_reason,
        stop_reason=chunk.stop_reason,
        prompt_logprobs=token_logprobs_to_proto(chunk.prompt_logprobs),
        tool_calls=[tandem_pb2.ToolCall(id=c.id, name=c.name, arguments=c.arguments)
                    for c in chunk.tool_calls],
        index=chunk.index,
        tool_call_deltas=[
            tandem_pb2.ToolCallDelta(index=d.index, id=d.id or "", name=d.name or "",
                                     arguments=d.arguments)
            for d in chunk.tool_call_deltas
        ],
    )
    if chunk.usage is not None:
        u = chunk.usage
        out.usage.CopyFrom(tandem_pb2.Usage(prompt_tokens=u.prompt_tokens,
                                            completion_tokens=u.completion_tokens,
                                            cached_tokens=u.cached_tokens))
    if chunk.timings is not None:
        t = chunk.timings
        out.timings.CopyFrom(tandem_pb2.Timings(
            queue_s=t.queue_s, prefill_s=t.prefill_s, transfer_s=t.transfer_s,
            first_token_s=t.first_token_s, decode_s=t.decode_s, total_s=t.total_s,
        ))
    return out


def tokenize_response_to_proto(token_ids: Sequence[int]) -> tandem_pb2.TokenizeResponse:
    """A tokenization's ids and their count."""
    return tandem_pb2.TokenizeResponse(token_ids=token_ids, count=len(token_ids))


def models_to_proto(models: Iterable[ModelInfo]) -> tandem_pb2.ListModelsResponse:
    """The served models."""
    return tandem_pb2.ListModelsResponse(models=[
        tandem_pb2.ModelInfo(id=m.id, max_model_len=m.max_model_len, owned_by=m.owned_by,
                             weights_format=m.weights_format)
        for m in models
    ])
