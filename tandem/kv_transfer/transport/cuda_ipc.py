"""CUDA IPC: GPU caches on one host, device-to-device, control frames over a Unix socket.

    sender HELLO(proof) carries its cache's cudaIpcMemHandle (torch ``_share_cuda_``)
    receiver opens it once per connection, then for each KV frame {layers, blocks, src_blocks}:
        kv_dst[lo:hi, :, dst] = kv_src[lo:hi, :, src]      (on the receiver's device, synced)

Pull model: the receiver writes only its own, checked, reserved blocks; the sender's cache is
read-only to it by convention. No bytes cross a wire, so no hash is computed. The sender must
keep the source blocks unchanged until COMMIT is acknowledged (true of every transport).

Tested only where a GPU is lent (``@pytest.mark.gpu``); never faked.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import socket
import tempfile
from typing import Any

import torch

from tandem.kv_transfer.blocks import TORCH_DTYPES, KvBlocks, RecvSpan, SendSpan
from tandem.kv_transfer.config import Limits
from tandem.kv_transfer.endpoint import Endpoint
from tandem.kv_transfer.errors import ChannelClosed, MalformedFrame, OutsideReservation
from tandem.kv_transfer.frames import Header, HeaderCodec
from tandem.kv_transfer.transport.base import Alive, Channel, Handler, Listener, Transport
from tandem.kv_transfer.transport.sockets import SocketChannel, SocketListener

_FIELDS: dict[str, type] = {
    "cuda_device": int, "cuda_handle": bytes, "cuda_size": int, "cuda_offset": int,
    "cuda_ref_handle": bytes, "cuda_ref_offset": int, "cuda_event_handle": bytes,
    "cuda_event_sync": bool, "cuda_tensor_offset": int, "cuda_num_blocks": int,
}


class CudaIpcChannel(SocketChannel):
    """Control frames on a Unix socket; payloads pulled from the sender's exported cache."""

    def __init__(self, sock: socket.socket, codec: HeaderCodec, max_payload: int, peer: str,
                 blocks: KvBlocks) -> None:
        super().__init__(sock, codec, max_payload, "cuda_ipc", peer)
        self._blocks = blocks
        self._src: torch.Tensor | None = None  # the sender's cache, mapped here

    def client_hello_extras(self) -> dict[str, Any]:
        kv = self._blocks.kv
        (device, handle, size, offset, ref_handle, ref_offset, event_handle,
         event_sync) = kv.untyped_storage()._share_cuda_()
        return {"cuda_device": int(device), "cuda_handle": bytes(handle), "cuda_size": int(size),
                "cuda_offset": int(offset), "cuda_ref_handle": bytes(ref_handle or b""),
                "cuda_ref_offset": int(ref_offset), "cuda_event_handle": bytes(event_handle or b""),
                "cuda_event_sync": bool(event_sync), "cuda_tensor_offset": kv.storage_offset(),
                "cuda_num_blocks": self._blocks.num_blocks}

    def server_setup(self, hello: Header) -> dict[str, Any]:
        for name, typ in _FIELDS.items():
            if type(hello.get(name)) is not typ:
                raise MalformedFrame(f"cuda_ipc HELLO lacks {name}")
        layout = self._blocks.layout
        shape = (layout.num_layers, layout.planes, hello["cuda_num_blocks"], layout.block_size,
                 layout.num_kv_heads, layout.row_width)
        numel = 1
        for d in shape:
            numel *= d
        if (hello["cuda_tensor_offset"] + numel) * layout.itemsize > hello["cuda_size"]:
            raise MalformedFrame("cuda_ipc storage is smaller than the announced cache")
        torch.cuda._lazy_init()
        storage = torch.UntypedStorage._new_shared_cuda(
            hello["cuda_device"], hello["cuda_handle"], hello["cuda_size"], hello["cuda_offset"],
            hello["cuda_ref_handle"] or None, hello["cuda_ref_offset"],
            hello["cuda_event_handle"] or None, hello["cuda_event_sync"])
        src = torch.empty(0, dtype=TORCH_DTYPES[layout.kv_dtype],
                          device=f"cuda:{hello['cuda_device']}")
        self._src = src.set_(storage, hello["cuda_tensor_offset"], shape)
        return {}

    async def send(self, header: Header, span: SendSpan | None = None) -> None:
        if span is not None:
            header = {**header, "src_blocks": span.ids}
        await super().send(header)

    async def recv_payload(self, header: Header, span: RecvSpan | None, alive: Alive) -> bool:
        src_ids = header.get("src_blocks")
        if self._src is None or not isinstance(src_ids, list):
            raise MalformedFrame("cuda_ipc KV frame without src_blocks or before setup")
        if len(src_ids) != len(header["blocks"]) or \
                any(not 0 <= b < self._src.shape[2] for b in src_ids):
            raise OutsideReservation("cuda_ipc src_blocks outside the sender's cache")
        if span is None or not alive():  # the fence: check, copy and sync with no await
            return False
        dst = span.blocks.kv
        idx_src = torch.tensor(src_ids, dtype=torch.long, device=self._src.device)
        idx_dst = torch.tensor(span.ids, dtype=torch.long, device=dst.device)
        moved = self._src[span.lo:span.hi].index_select(2, idx_src).to(dst.device)
        dst[span.lo:span.hi].index_copy_(2, idx_dst, moved)
        torch.cuda.current_stream(dst.device).synchronize()
        return True

    def close(self) -> None:
        super().close()
        self._src = None


class CudaIpcTransport(Transport):
    """Same-host GPU-to-GPU transport (see the module docstring)."""

    name = "cuda_ipc"

    def __init__(self, limits: Limits, *, socket_dir: str | None = None) -> None:
        self._codec = HeaderCodec(limits)
        self._max_payload = limits.max_payload_bytes
        self._dir = socket_dir or tempfile.gettempdir()

    async def listen(self, handler: Handler, blocks: KvBlocks) -> Listener:
        path = os.path.join(self._dir, f"tandem-kv-cuda-{os.getpid()}-{secrets.token_hex(6)}.sock")
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.bind(path)
        os.chmod(path, 0o600)
        sock.listen(256)

        def make(conn: socket.socket, peer: str) -> Channel:
            return CudaIpcChannel(conn, self._codec, self._max_payload, peer, blocks)

        def unlink() -> None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)

        return SocketListener(sock, "cuda_ipc", path, make, handler, on_close=unlink)

    def reaches(self, endpoint: Endpoint, blocks: KvBlocks) -> bool:
        return blocks.is_cuda and endpoint.same_host and endpoint.address("cuda_ipc") is not None

    async def connect(self, address: str, blocks: KvBlocks, timeout: float) -> Channel:
        loop = asyncio.get_running_loop()
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.setblocking(False)
            await asyncio.wait_for(loop.sock_connect(sock, address), timeout)
        except (OSError, asyncio.TimeoutError) as exc:
            sock.close()
            raise ChannelClosed(f"cuda_ipc connect to {address}: {exc!r}") from exc
        return CudaIpcChannel(sock, self._codec, self._max_payload, f"unix:{address}", blocks)
