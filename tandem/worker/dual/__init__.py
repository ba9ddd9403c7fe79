"""One worker process that serves either role and flips between them with its weights
loaded (``python -m tandem.worker.dual --role decode ...``; docs/design.md, "Role flips").
The only module of ``tandem.worker`` that imports both roles."""
