"""What a GPU's memory reads at in practice: the floors and percentages the kernel benchmarks print.

Measured rates, not the datasheets': on an H200 the decode attention kernel reaches 93-96 % of
4.3 TB/s (datasheet 4.8; benchmarks/NOTES.md); on an H100 80GB HBM3 a CUDA graph of kernels that
only read the 14B layer's FP8 weights reads 3.0 TB/s (datasheet 3.35; `python -m
benchmarks.launch_overlap`, docs/reports/h100/launch_overlap/).
"""

from __future__ import annotations

READ_TB_S = {"H200": 4.3, "H100": 3.0}  # by a name the device's contains
FALLBACK = "H200"


def read_ceiling(device_name: str) -> tuple[float, str]:
    """(TB/s, which figure): the device's measured read rate, else the H200's, saying so."""
    for name, tb_s in READ_TB_S.items():
        if name in device_name:
            return tb_s, name
    return READ_TB_S[FALLBACK], f"the {FALLBACK}'s (none measured for {device_name})"
