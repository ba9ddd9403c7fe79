"""Accelerators the planner can size for without owning one: datasheet figures.

A roofline profile (tandem/planner/roofline.py) needs four numbers per device and two links::

    memory_bytes       HBM/GDDR capacity: weights + activations + KV cache
    hbm_bytes_per_s    memory bandwidth: bounds decode (every step reads all weights)
    bf16_flops         dense (not 2:4 sparse) BF16 tensor-core peak: bounds prefill
    fp8_flops          dense FP8 peak, None where the chip has no FP8 tensor cores
    tp_link            the link tensor-parallel all-reduces cross (NVLink, or PCIe)
    kv_link            the link a KV handoff to another worker crosses (NIC, or PCIe)

Figures are NVIDIA datasheet peaks (SXM/PCIe product briefs): marketing maxima that real
kernels reach a fraction of. roofline.py applies the efficiency factors (MFU, MBU, link
efficiency); nothing here is derated. Datasheet "GB" of memory is taken as GiB: nvidia-smi
reports 81,559 MiB on an H100 80GB and 81,920 MiB on an A100 80GB, within 1% of 80 GiB (an
L40S with ECC on reports 46,068 MiB of its 48: ``memory_utilization`` absorbs the rest).

Link bandwidths are per GPU and per direction: a 400 Gb/s NIC moves 50 GB/s each way, and a
server with one such NIC per GPU (DGX/HGX H100) hands a TP=4 worker's KV over at 4 x 50 GB/s.
Change ``kv_link`` (``dataclasses.replace``) for a fleet wired otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass

GiB = 1 << 30


@dataclass(frozen=True, slots=True)
class Interconnect:
    """A link between GPUs: peak bytes/s per GPU per direction and a fixed cost per message.

    ``latency_s`` is what one small message costs regardless of size: for ``tp_link`` the
    time of one small all-reduce (NCCL-class collectives take ~5-10 us over NVLink and tens
    of us over PCIe), for ``kv_link`` the one-way RDMA/PCIe latency (a few us; the handoff's
    RPC round trips are added by roofline.py).
    """

    name: str
    bytes_per_s: float
    latency_s: float


# Network and bus figures: 400 Gb/s = 50 GB/s; PCIe x16 Gen4 = 32 GB/s, Gen5 = 64 GB/s each
# way; NVLink 4 (H100/H200) 900 GB/s and NVLink 3 (A100) 600 GB/s total, half each way.
IB_NDR_400 = Interconnect("InfiniBand NDR / RoCE 400 Gb/s", 50e9, 5e-6)
IB_HDR_200 = Interconnect("InfiniBand HDR / RoCE 200 Gb/s", 25e9, 5e-6)
PCIE_GEN4_X16 = Interconnect("PCIe Gen4 x16", 32e9, 20e-6)
PCIE_GEN5_X16 = Interconnect("PCIe Gen5 x16", 64e9, 15e-6)
NVLINK_3 = Interconnect("NVLink 3 (600 GB/s)", 300e9, 8e-6)
NVLINK_4 = Interconnect("NVLink 4 (900 GB/s)", 450e9, 6e-6)


@dataclass(frozen=True, slots=True)
class Device:
    """One accelerator's datasheet peaks and the links its servers usually have."""

    name: str
    memory_bytes: int
    hbm_bytes_per_s: float
    bf16_flops: float  # dense
    fp8_flops: float | None  # dense; None: no FP8 tensor cores (weights-only FP8 runs BF16)
    tp_link: Interconnect
    kv_link: Interconnect

    def __post_init__(self) -> None:
        if min(self.memory_bytes, self.hbm_bytes_per_s, self.bf16_flops) <= 0:
            raise ValueError(f"device {self.name!r}: memory, bandwidth and FLOP/s must be > 0")


# NVIDIA datasheet figures (dense, i.e. the sparse TFLOP/s halved).
DEVICES: dict[str, Device] = {
    d.name: d
    for d in (
        # NVIDIA H100 datasheet, SXM5: HBM3 3.35 TB/s, BF16 989 TFLOP/s, FP8 1,979.
        Device("H100-SXM", 80 * GiB, 3.35e12, 989e12, 1979e12, NVLINK_4, IB_NDR_400),
        # NVIDIA H100 datasheet, PCIe: HBM2e 2.0 TB/s, BF16 756, FP8 1,513. Without the
        # optional NVLink bridge, TP crosses PCIe Gen5.
        Device("H100-PCIe", 80 * GiB, 2.0e12, 756e12, 1513e12, PCIE_GEN5_X16, IB_NDR_400),
        # NVIDIA H200 datasheet, SXM: HBM3e 4.8 TB/s, 141 GB; same compute as H100 SXM.
        Device("H200", 141 * GiB, 4.8e12, 989e12, 1979e12, NVLINK_4, IB_NDR_400),
        # NVIDIA L40S datasheet: GDDR6 864 GB/s, BF16 362 (733 sparse), FP8 733. No NVLink:
        # TP and any KV leaving the card cross its PCIe Gen4 x16 link.
        Device("L40S", 48 * GiB, 864e9, 362e12, 733e12, PCIE_GEN4_X16, PCIE_GEN4_X16),
        # NVIDIA A100 datasheet, 80GB SXM: HBM2e 2,039 GB/s, BF16 312, no FP8. DGX A100
        # has one 200 Gb/s HDR NIC per GPU.
        Device("A100-80GB-SXM", 80 * GiB, 2.039e12, 312e12, None, NVLINK_3, IB_HDR_200),
    )
}


def get_device(name: str) -> Device:
    """The table's device called ``name`` (case-insensitive); KeyError lists the names."""
    for key, device in DEVICES.items():
        if key.lower() == name.lower():
            return device
    raise KeyError(f"unknown device {name!r}; known: {', '.join(DEVICES)}")
