"""When a layer's KV is really in the cache: the handle the prefill role's layer hook carries.

    CPU:  the layer's KV is written when the model's layer returns ──> WRITTEN (never waits)
    CUDA: the layer's kernels are only queued ──> a CUDA event recorded on the engine thread as
          the hook fires; ``wait`` blocks until the device has run them (the pusher waits on
          a pool thread, never on the engine thread)

The worker sees the handle only through ``LayerReady``: it never touches the device itself.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import torch


class LayerReady(Protocol):
    """Whether a layer the hook named is already written, and a way to wait until it is."""

    @property
    def pending(self) -> bool:
        """True when ``wait`` may block (the device is still writing the layer)."""
        ...

    def wait(self) -> None:
        """Block until the layer's KV is in the cache (call it off the engine thread)."""
        ...


class _Written:
    """A layer already in the cache (host memory): nothing to wait for."""

    pending = False

    def wait(self) -> None:
        """Return at once."""


WRITTEN: LayerReady = _Written()


class _DeviceEvent:
    """A layer queued on the current CUDA stream: an event recorded behind its kernels."""

    pending = True

    def __init__(self) -> None:
        self._event = torch.cuda.Event()
        self._event.record()

    def wait(self) -> None:
        """Block until the kernels before the event have run."""
        self._event.synchronize()


def layer_ready_for(device: torch.device) -> Callable[[], LayerReady]:
    """What the engine makes, on its thread, each time a layer hook fires on ``device``."""
    if device.type == "cuda":
        return _DeviceEvent
    return lambda: WRITTEN
