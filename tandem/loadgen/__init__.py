"""The serving load generator: what ``tandem bench`` (and scripts/bench_serve.py) sends to a
Tandem router, and how it reports what came back.

    workload    open-loop requests of a mix (RAG / chat): Poisson arrivals, random prompts
    multiturn   multi-turn chat conversations that grow turn by turn (prefix reuse)
    load        drive an endpoint with them (router gRPC, the worker RPCs, OpenAI HTTP)
    stats       per-request records -> TTFT / TPOT / ITL / E2E percentiles, goodput, SLO attainment
    sweep       rate sweeps: attainment per offered rate, the capacity at 90%
    report      tables and plots of summaries and sweeps
    run         the shared load flags and one load run (``tandem bench``'s engine)

Client-side only: it speaks to a cluster through tandem.protos (gRPC) or HTTP and imports no
torch, engine, router, worker, ray or kubernetes, so it ships in the lean tandem-client
distribution. The request shapes are tandem/common/request_shapes.py's, the ones the planner's
simulator replays.
"""
