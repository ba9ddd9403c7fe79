"""The router's public API as plain types: what a ``tandem.v1.Tandem`` call and an OpenAI
HTTP request both become at the edge, and what the frontend answers.

    sampling.py  SamplingSpec, StructuredOutput, LogprobOptions
    chat.py      ChatMessage, Chat
    request.py   GenerateRequest (its prompt: text | token ids | Chat), TokenizeRequest
    response.py  ResponseChunk (one message of a generation), TokenLogprob, Usage, Timings,
                 ModelInfo

Frozen dataclasses: nothing past the edges sees a protobuf (tandem/router/convert turns the
gRPC messages into these and back; the HTTP API builds them from JSON directly).
"""
