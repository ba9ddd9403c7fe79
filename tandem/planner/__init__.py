"""Capacity planning for Tandem: how many prefill and decode workers a workload needs.

    profile.py    what one worker costs: the step-cost model (linear, or a measured curve by
                  new tokens), KV capacity, KV transfer speed; JSON (tandem.profile/1)
    fit.py        fitting that model to timed engine steps (``tandem profile``,
                  tandem/profiler, does the timing)
    roofline.py   profiles for hardware this machine does not have, from devices.py
                  (datasheet figures) and models.py (model shapes): estimates
    trace.py      a request trace (JSON lines): arrivals, lengths, shared prefixes
    workload.py   trace generators: Poisson, bursty (MMPP), diurnal, multi-turn chat, over
                  the serving benchmark's request shapes (tandem/common/request_shapes.py,
                  which the load generator tandem/loadgen sends too)
    sizing.py     first-guess pool sizes from a trace's token mix
    sim/          the discrete-event simulator: router (the real placement policy and cost
                  model, imported from tandem.placement), prefill and decode workers, KV
                  transfer, failures and scale events
    search.py     `tandem plan`: the cheapest P:D split and the cheapest colocated pool
                  meeting the SLOs, their goodput and attainment curves
    link_report.py  `tandem plan --link-gbps`: the prompt length and link speed below which
                  the router's decision keeps prompts colocated on that link
    report.py     the plan as a table, JSON, Helm values and `tandem up` flags; plot.py: PNG

Pure Python, no torch and no engine: a plan for 1,000 GPUs runs on a laptop. Imports
tandem.placement (the router's own ranking and cost model), the autoscaler's policies and
tandem.common; never the router, which speaks gRPC.
"""
