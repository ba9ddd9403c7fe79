"""Transports behind one interface (``base.Transport``/``base.Channel``).

``tcp`` (default, crosses hosts, optional TLS), ``shm`` (same host), ``cuda_ipc`` (GPU caches on
one host; imported lazily, only when a cache is on CUDA) and ``fake`` (in-process, for tests).
"""

from __future__ import annotations

from tandem.kv_transfer.config import ReceiverConfig, SenderConfig
from tandem.kv_transfer.transport.base import Channel, Listener, Transport
from tandem.kv_transfer.transport.fake import FakeNetwork, FakeTransport
from tandem.kv_transfer.transport.shm import ShmTransport
from tandem.kv_transfer.transport.tcp import TcpTransport

__all__ = [
    "Channel", "FakeNetwork", "FakeTransport", "Listener", "ShmTransport", "TcpTransport",
    "Transport", "receiver_transports", "sender_transports",
]


def receiver_transports(config: ReceiverConfig, cuda: bool) -> list[Transport]:
    """What a receiver listens on by default: TCP and shm as configured, CUDA IPC on GPUs."""
    out: list[Transport] = []
    if cuda:
        from tandem.kv_transfer.transport.cuda_ipc import CudaIpcTransport

        out.append(CudaIpcTransport(config.limits, socket_dir=config.socket_dir))
    if config.enable_shm:
        out.append(ShmTransport(config.limits, slots=config.shm_slots,
                                slot_bytes=config.shm_slot_bytes, socket_dir=config.socket_dir,
                                checksum=config.shm_checksum))
    if config.enable_tcp:
        out.append(TcpTransport(config.limits, socket_buffer_bytes=config.socket_buffer_bytes,
                                tls=config.tls, host=config.host, port=config.port,
                                advertise_host=config.advertise_host))
    return out


def sender_transports(config: SenderConfig, cuda: bool) -> list[Transport]:
    """A sender's transports in preference order: CUDA IPC, shm (same host), then TCP."""
    out: list[Transport] = []
    if cuda:
        from tandem.kv_transfer.transport.cuda_ipc import CudaIpcTransport

        out.append(CudaIpcTransport(config.limits))
    if config.prefer_shm:
        out.append(ShmTransport(config.limits))
    out.append(TcpTransport(config.limits, socket_buffer_bytes=config.socket_buffer_bytes,
                            tls=config.tls))
    return out
