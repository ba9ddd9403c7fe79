"""KV transfer: push a prompt's KV blocks from a prefill worker into a decode worker's
reserved blocks. Length-prefixed msgpack frames, raw payload bytes, never pickle; TCP, shared
memory, CUDA IPC and an in-process fake behind one transport interface.

The spec is docs/kv_transfer.md. Decode side: ``Receiver`` (reserve/release/events). Prefill
side: ``Sender`` (open -> push layers -> commit/abort). Both take the cache tensor
``[num_layers, planes, num_blocks, block_size, num_kv_heads, head_dim]`` and a ``KvLayout``
(planes: K and V, or the one latent plane of an MLA model).
"""

from tandem.kv_transfer.config import Limits, ReceiverConfig, SenderConfig, TlsConfig
from tandem.kv_transfer.endpoint import Endpoint, local_host_id
from tandem.kv_transfer.errors import (
    AuthenticationError,
    ChannelClosed,
    ChecksumMismatch,
    ConfigError,
    ConnectionLost,
    DeadlineExceeded,
    HandshakeError,
    KvTransferError,
    LayoutMismatchError,
    NoRouteError,
    PeerBusy,
    ProtocolError,
    ReservationError,
    TransferAborted,
    TransferFailed,
    TransferRejected,
    TransferSpecError,
    VersionMismatch,
)
from tandem.kv_transfer.events import Aborted, Committed, Expired, TransferEvent
from tandem.kv_transfer.layout import KvLayout
from tandem.kv_transfer.outgoing import OutgoingTransfer
from tandem.kv_transfer.receiver import Receiver, ReceiverStats
from tandem.kv_transfer.sender import Sender, SenderStats

__all__ = [
    "Aborted", "AuthenticationError", "ChannelClosed", "ChecksumMismatch", "Committed",
    "ConfigError", "ConnectionLost", "DeadlineExceeded", "Endpoint", "Expired", "HandshakeError",
    "KvLayout", "KvTransferError", "LayoutMismatchError", "Limits", "NoRouteError",
    "OutgoingTransfer", "PeerBusy", "ProtocolError", "Receiver", "ReceiverConfig",
    "ReceiverStats", "ReservationError", "Sender", "SenderConfig", "SenderStats", "TlsConfig",
    "TransferAborted", "TransferEvent", "TransferFailed", "TransferRejected", "TransferSpecError",
    "VersionMismatch", "local_host_id",
]
