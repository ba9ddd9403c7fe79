"""What ``tandem profile`` runs: a worker's costs measured on this machine, for ``tandem plan``.

    engine_profile   ProfileOptions, profile_engine: time the real engine, fit the step-cost
                     model of tandem/planner/profile.py, return a Profile
    engine_steps     the timed steps of each shape (prefill, chunks after cached tokens,
                     decode rows, a prompt joining them) and the rounds over them
    transfer_probe   kv_transfer's TCP transport timed against a receiver child process
                     (bench/transfer/kv_transfer.py compares it with a raw socket, shm and memcpy)

Server-side: it imports the engine (torch), kv_transfer and the planner's model. The planner
never imports this package; ``tandem plan --device`` estimates what it cannot measure.
"""
