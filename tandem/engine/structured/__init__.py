"""Structured outputs: constrain a request's tokens to a grammar (xgrammar underneath).

    StructuredOutput (spec.py: what the client asked, validated, torch-free)
        ──GrammarEngine.prepare (grammar_engine.py: once per spec hash, refusals remembered)──>
          CompilePool (compile_pool.py: one at a time on a niced thread, a CPU-time budget)
    compiled grammar ──GrammarEngine.constraint──> Constraint (constraint.py: one per request)
        the sampler asks it for a token bitmask per constrained row (tandem/engine/sampler.py),
        the engine feeds it every appended token, a resumed request replays its output.

Only constrained rows pay: the sampler skips all of this for a batch with no constraint.
"""

from tandem.engine.structured.spec import StructuredOutput

__all__ = ["StructuredOutput"]
