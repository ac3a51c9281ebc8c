"""Page-locking the shared buffers on CUDA, so that logits cross by DMA instead of through a staging copy.

Both sides of a model worker map the same memfds (scoring/worker/wire.py SharedBuffer). On CUDA each side
registers the buffers its device copies use as page-locked memory (`cudaHostRegister`): the worker copies its
logits device-to-host into the registered output buffer (and its tokens host-to-device from the registered
input buffer), the scorer uploads the logits from the registered output buffer into a device tensor of its
own. A pageable buffer goes through the driver's staging copy on each transfer; a registered one does not
(the first GPU run: 155 k tokens/s through pageable memory against 5.5 M tokens/s for the model alone).

Registration is an optimisation and never a condition: it is tried per buffer, per side, and any failure
(a nonzero return, an exception, RLIMIT_MEMLOCK too low, no CUDA) leaves that buffer on today's pageable
path, with the reason kept for the record (`SharedBuffer.pin` returns it). On CPU nothing is registered
(reason "cpu") and the path is the one it always was, to the bit.

`registrar_for(device)` is the one seam: tests replace it with a fake registrar (scoring/worker/pinning.py is
imported by both sides; a CPU machine cannot register anything).
"""

from __future__ import annotations

from typing import Any, Protocol

import torch

PINNED = "pinned"
PAGEABLE = "pageable"
CROSSING_VERSION = 2
"""Version of the `crossing` sub-record of a score (scoring/score/remote.py crossing_record). 2: `scorer_by_worker`,
the scorer's path for every scoring worker's buffer (on a node each worker's GPU registers its own)."""
HOST_REGISTER_FLAGS = 0
"""cudaHostRegisterDefault: each side registers for its own device's context (the one that copies)."""


class Registrar(Protocol):
    """What pins host memory: `register` and `unregister` return 0 on success, else the CUDA error code."""

    def register(self, ptr: int, nbytes: int) -> int: ...

    def unregister(self, ptr: int) -> int: ...


class CudaRegistrar:
    """cudaHostRegister / cudaHostUnregister through torch's binding of the CUDA runtime, on `device`."""

    def __init__(self, device: torch.device):
        self.device = device

    def register(self, ptr: int, nbytes: int) -> int:
        with torch.cuda.device(self.device):
            return int(torch.cuda.cudart().cudaHostRegister(ptr, nbytes, HOST_REGISTER_FLAGS))

    def unregister(self, ptr: int) -> int:
        with torch.cuda.device(self.device):
            return int(torch.cuda.cudart().cudaHostUnregister(ptr))


def registrar_for(device: torch.device) -> Registrar | None:
    """The registrar for copies to and from `device`; None where nothing is pinned (CPU). The seam tests replace."""
    return CudaRegistrar(device) if device.type == "cuda" else None


def synchronize(device: torch.device) -> None:
    """Wait for the copies queued on `device`'s current stream (nothing to wait for on CPU)."""
    if device.type == "cuda":
        torch.cuda.current_stream(device).synchronize()


def side_record(buffers: dict[str, Any]) -> dict[str, str]:
    """{buffer name: "pinned" | "pageable", ..., "why": the reasons a buffer is pageable ("" when all pinned)}
    for SharedBuffers (scoring/worker/wire.py) by name."""
    rec = {name: PINNED if b.pinned else PAGEABLE for name, b in buffers.items()}
    why = sorted({b.pin_why for b in buffers.values() if not b.pinned})
    return {**rec, "why": "; ".join(why)}
