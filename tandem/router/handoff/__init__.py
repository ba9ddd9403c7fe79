"""The two-leg ledger: running one admitted request across a decode and a prefill worker.

One request's life here, from the front door's Prepared to the Chunks it streams back::

    Prepared + Deadline
      -> policy.rank_decode            which decode worker D (cached prefix, load, free blocks)
      -> legs.reserve(D)               D reuses its cached prefix of the prompt, holds blocks
                                       for the rest + max_tokens, under a lease
      -> policy.rank_prefill           prefill candidates (prefix affinity, then load)
      -> cost_model.decide             remote on which P, or local on D (the cost model)
      -> legs.prefill(P)               P pushes the uncached blocks' KV into D, commits the
                                       first token
           | P fails: next P on a fresh reservation; then legs.prefill_local(D)
           | D fails under P's push (P says so): the leg is lost, migrate as below
      -> first token                   straight from P's reply (TTFT does not wait for D)
      -> legs.decode_stream(D)         the rest of the tokens
           | D dies: migrate: reserve on D', prefill prompt + tokens sent, go on
           | a live move (live_moves): D suspends it, D' reserves, D pushes its KV, go on at D'
      -> legs.abort(...)               every leg still open when the request ends abnormally

- ``ledger``: ``Handoff`` (the loop above, migration included).
- ``deps``: ``HandoffDeps``, what every handoff shares (pool, channels, affinity, counters).
- ``prefill_leg``: filling one decode leg's reservation (remote on a prefill worker, the
  fallbacks, local on the decode worker) and learning its cost back.
- ``open_legs``: the legs a request holds open (Aborted on every abnormal end), and what a
  failed call or a lost leg says about its worker.
- ``live_moves``: every decode stream in flight by worker, and moving them live to another
  decode worker (an operator's drain; the ledger follows its stream across the move).
- ``legs``: the worker RPCs, gRPC failures turned into typed errors; each converts the plain
  ``leg_types`` (LegRequest, Reservation, PrefillReply) to its worker message and back.
- ``prefill_placement``: the placement decision's inputs from the router's state (cached tokens per
  worker, the learnt overheads) and the overhead learnt back from each placed prefill
  (remote on a prefill worker, local on the decode worker).
- ``inflight``: every worker call in flight, by endpoint, so the health monitor can cut them.
- ``blame``: which failed call takes its worker out of the pool (a failed channel only; never a
  slow call, nor a prefill worker's report that its receiver failed).
- ``held_blocks``: which prompt blocks each worker holds (its reports + what was just sent).
- ``deadline``: the request's deadline (each call's timeout with legs' defaults).
- ``counters``: the count of every fallback and migration (read by the metrics).

The pure policy it calls (``policy``, ``cost_model``, ``overheads``, ``affinity``, the placement
``log``) lives in tandem/placement, shared with the planner's simulator. Imports that, the
membership package (who is in the pool, and the channels to them) and the router's shared leaf
modules (config, errors, request); never the front door.
"""
