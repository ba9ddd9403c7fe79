"""What a request is charged: its sequences and its prompt's tokens, the same at both edges."""

from __future__ import annotations

from tandem.router.api.chat import Chat, ChatMessage
from tandem.router.cost import NOTHING, Cost, prompt_tokens, request_cost
from tandem.router.http import fanout
from tandem.router.http.openai_request import Endpoint, parse


def test_prompt_tokens_by_kind_capped_at_the_context() -> None:
    assert prompt_tokens((1, 2, 3), 100) == 3  # token ids: their count
    assert prompt_tokens("hello", 100) == 5  # text: its characters
    chat = Chat(messages=(ChatMessage("system", "be brief"), ChatMessage("user", "hi")),
                tools_json='[{"type": "function"}]')
    assert prompt_tokens(chat, 1000) == len("be brief") + len("hi") + len(chat.tools_json)
    assert prompt_tokens("x" * 500, 100) == 100  # no admitted prompt is longer
    assert prompt_tokens(tuple(range(500)), 100) == 100
    assert prompt_tokens(None, 100) == 0
    assert request_cost("hello", 4, 100) == Cost(4, 5)  # forked: tokens counted once


def test_cost_arithmetic_and_bounds() -> None:
    a, b = Cost(3, 40), Cost(2, 10)
    assert a + b == Cost(5, 50) and a - b == Cost(1, 30) and NOTHING + a == a
    assert a.within(Cost(3, 40)) and not a.within(Cost(2, 40)) and not a.within(Cost(3, 39))
    assert a.within(Cost(0, 40)) and a.within(Cost(3, 0)) and a.within(NOTHING)  # 0: unbounded
    assert a.over(Cost(3, 40)) is None
    assert a.over(Cost(2, 100)) == "3 sequences (at most 2)"
    assert a.over(Cost(5, 39)) == "40 prompt tokens (at most 39)"


def test_an_http_request_is_charged_prompts_times_sequences() -> None:
    batch = parse(Endpoint.COMPLETIONS, {"prompt": ["ab", "cde", [7, 8, 9, 10]], "n": 2,
                                         "best_of": 3})
    assert fanout.cost(batch, 100) == Cost(3 * 3, 2 + 3 + 4)  # max(n, best_of) per prompt
    chat = parse(Endpoint.CHAT, {"messages": [{"role": "user", "content": "hello"}], "n": 5})
    assert fanout.cost(chat, 100) == Cost(5, 5)
    one = parse(Endpoint.COMPLETIONS, {"prompt": "x" * 300})
    assert fanout.cost(one, 100) == Cost(1, 100)
