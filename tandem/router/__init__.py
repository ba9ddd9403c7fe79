"""Tandem's router: the public front door, the handoff of each request, and the worker pool.

    tandem/router/          front door: gRPC servicer, http/, validation, tokenizer, admission,
                     server, cli, metrics, auth/TLS; shared leaves: config, errors, request,
                     status (the front door imports the subpackages, never the reverse)
      handoff/       one request's legs: ledger (migration included), legs, the placement's
                     inputs, held blocks, deadline, counters
      membership/    the pool: registry, Registry service, health monitor, Kubernetes
                     discovery, the channels to workers

The ranking policies, the placement cost model and the worker snapshot they read are
tandem/placement's (shared with the planner). Imports protos, common, placement and a
tokenizer only (never torch or the engine): everything here is bookkeeping and I/O, so it
starts fast and runs anywhere.
"""
