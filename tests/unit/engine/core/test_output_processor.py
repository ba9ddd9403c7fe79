"""Output processing (pure Python): appending, stop checks in their order, outputs."""

from __future__ import annotations

from tandem.engine.core.output_processor import OutputProcessor
from tandem.engine.core.request import Request, RequestStatus
from tandem.engine.outputs import SampleResult
from tandem.engine.sampling_params import SamplingParams

EOS = 2


class _Detok:
    """Each token is one letter; ``stop`` matches a whole letter, as a stop string would."""

    def __init__(self, stop: str | None = None) -> None:
        self.text = ""
        self.stop_reason: str | None = None
        self._stop = stop
        self._held = ""

    def add(self, token_id: int) -> str:
        if self.stop_reason is not None:
            return ""
        letter = chr(ord("a") + token_id % 26)
        if letter == self._stop:
            self.stop_reason = letter
            return ""
        self.text += letter
        return letter

    def flush(self) -> str:
        return ""


def _req(params: SamplingParams, n_prompt: int = 3) -> Request:
    return Request("r", list(range(10, 10 + n_prompt)), params)


def _res(*tokens: int) -> list[SampleResult]:
    return [SampleResult(t, -0.5, [(t, -0.5)]) for t in tokens]


def test_tokens_append_until_max_tokens() -> None:
    proc = OutputProcessor(frozenset({EOS}), max_model_len=100)
    req = _req(SamplingParams(max_tokens=3, logprobs=1))
    out = proc.append(req, _Detok(), _res(5))
    assert (out.new_token_ids, out.new_text, out.finished) == ([5], "f", False)
    assert out.logprobs is not None and out.logprobs[0].top == [(5, -0.5)]
    out = proc.append(req, _Detok(), _res(6, 7, 8))  # a speculative step's three tokens
    assert out.new_token_ids == [6, 7] and out.finished  # nothing past max_tokens
    assert out.finish_reason == "length" and req.status is RequestStatus.FINISHED_LENGTH
    assert out.token_ids == [5, 6, 7] and proc.num_generated_tokens == 3


def test_eos_stops_after_min_tokens_unless_ignored() -> None:
    proc = OutputProcessor(frozenset({EOS}), max_model_len=100)
    req = _req(SamplingParams(max_tokens=10, min_tokens=2))
    assert not proc.append(req, None, _res(EOS)).finished  # too early to stop
    out = proc.append(req, None, _res(EOS))
    assert out.finished and out.finish_reason == "stop" and out.stop_reason is None
    assert out.text == "" and out.logprobs is None  # no detokenizer, none asked for
    ignoring = _req(SamplingParams(max_tokens=10, ignore_eos=True))
    assert not proc.append(ignoring, None, _res(EOS)).finished


def test_stop_token_and_stop_string_set_the_reason() -> None:
    proc = OutputProcessor(frozenset(), max_model_len=100)
    req = _req(SamplingParams(max_tokens=10, stop_token_ids=[4]))
    out = proc.append(req, None, _res(3, 4, 5))
    assert out.new_token_ids == [3, 4] and out.stop_reason == 4
    req = _req(SamplingParams(max_tokens=10))
    detok = _Detok(stop="c")
    out = proc.append(req, detok, _res(0, 1, 2, 3))
    assert out.finished and out.stop_reason == "c" and out.text == "ab"
    assert out.new_token_ids == [0, 1, 2]


def test_context_length_ends_the_request() -> None:
    proc = OutputProcessor(frozenset(), max_model_len=5)
    req = _req(SamplingParams(max_tokens=10), n_prompt=3)
    assert not proc.append(req, None, _res(1)).finished
    out = proc.append(req, None, _res(1))
    assert out.finished and out.finish_reason == "length"


def test_finish_without_a_token() -> None:
    proc = OutputProcessor(frozenset(), max_model_len=100)
    req = _req(SamplingParams())
    out = proc.finish(req, _Detok(), RequestStatus.FINISHED_ABORTED)
    assert out.finished and out.finish_reason == "abort" and out.new_token_ids == []
    assert out.num_cached_tokens == 0  # never scheduled (-1) reports 0
