"""Protobuf messages <-> the router's plain types, at the edges and nowhere else.

    sampling.py    SamplingParams, StructuredOutput, LogprobOptions, TokenLogprob (both ways:
                   clients send them, workers are sent them, workers answer logprobs)
    public.py      tandem.v1.Tandem: GenerateRequest / TokenizeRequest in, GenerateResponse /
                   TokenizeResponse / ListModelsResponse out (tandem/router/servicer.py)
    legs.py        the handoff's worker calls: Reserve / Prefill / Decode / Abort requests
                   out, their replies in (tandem/router/handoff/legs.py)
    membership.py  WorkerStats and Register's role in (the Registry service, the health
                   monitor's probes)

Conversions only: no checks (tandem/router/validation.py checks the plain request) and no
defaults beyond what the wire's own unset fields mean.
"""
