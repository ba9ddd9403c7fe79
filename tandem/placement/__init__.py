"""Placement and ranking policy: which worker takes a request, and where its prompt is prefilled.

Pure decisions over plain snapshots, shared by the router (which serves them) and the planner's
simulator (which replays them at 1,000 workers)::

    worker_view   ``Role`` and ``WorkerView``: one worker's load and fitted step costs, the
                  snapshot every function here reads (the router builds it from the pool)
    policy        rank_decode / rank_prefill: candidates best first (prefix holder, load, room)
    affinity      prefix-hash chains and the bounded LRU of which prefill worker served a prefix
    cost_model    the per-request decision: remote on a prefill worker or local on the decode
                  worker, from each option's predicted TTFT and decode token gap against the SLO
    overheads     ``PrefillOverheads``: what each worker's prefills take beyond that prediction,
                  learnt per push size and faded when not renewed
    link          ``LinkEstimates``: a KV push's price per prefill/decode pair, learnt from
                  its pushes, faded back to a configured ``LinkPrior``
    slo           ``Slo`` (the TTFT and TPOT targets) and the latency buckets they are read in
    log           the ``--placement-log`` records: each decision with its inputs, read back and
                  summarized (the simulator writes the same records)

Imports tandem.common and the standard library only: no torch, no gRPC, no router. The router
converts what it knows (registry entries, Stats replies) into these values at its edge.
"""
