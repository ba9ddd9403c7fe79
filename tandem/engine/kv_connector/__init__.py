"""The engine's KV connector: its disaggregation seam, split by role (DESIGN.md section 2).

    decode worker:  engine.remote.decode   reserve ──> commit | commit_forked | end
                                           | prefill_locally         (decode_side.py)
    prefill worker: engine.remote.prefill  add ──> layer hook ──> held_block_ids ──> release
                                                                     (prefill_side.py)
    decode worker:  engine.remote.migrate  suspend ──> resume | engine.abort  (a live move of
                                           a running request to another engine: migrate_side.py;
                                           pin ──> unpin: its pre-copy)
    both:           engine.remote.kv_cache, kv_cache_spec()  (what the transfer layer moves)

``KVConnector`` (connector.py) owns both roles; the ledger they share is
tandem/engine/core/remote_kv.py; what they need from the engine is ``LiveRequestHost``
(host.py); the prefill hook's "layer written" handle is ``LayerReady`` (layer_ready.py).
"""

from tandem.engine.kv_connector.connector import KVConnector, describe_cache
from tandem.engine.kv_connector.decode_side import DecodeSide
from tandem.engine.kv_connector.host import LiveRequestHost
from tandem.engine.kv_connector.layer_ready import WRITTEN, LayerReady, layer_ready_for
from tandem.engine.kv_connector.migrate_side import MigrateSide, Pinned, Suspended
from tandem.engine.kv_connector.prefill_side import KVLayerHook, PrefillSide

__all__ = ["WRITTEN", "DecodeSide", "KVConnector", "KVLayerHook", "LayerReady",
           "LiveRequestHost", "MigrateSide", "Pinned", "PrefillSide", "Suspended", "describe_cache", "layer_ready_for"]
