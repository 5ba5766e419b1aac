"""Policy settings. Scorer weights: each scorer returns 0..100; the chain multiplies by weight/100. Defaults are
GPUStack's max scores, so contributions match its numbers."""

from __future__ import annotations

from math import comb

from pydantic import BaseModel, ConfigDict, Field, model_validator

MAX_WEIGHT = 10_000.0  # a scorer's weight: 100x the largest default; the chain's figures stay finite
# the GGUF RPC search tries every combination of up to max_rpc_servers of up to max_rpc_gpus GPUs: its
# defaults (8 of 16) are 39,202; a setting (an operator's, or an audit's replay through the control
# plane) may ask for about 2.5 times that, never a search that holds the control plane's worker for hours
MAX_RPC_COMBINATIONS = 100_000


def rpc_combinations(servers: int, gpus: int) -> int:
    """The combinations the RPC search may try: sum of C(gpus, k) for k = 1..min(servers, gpus)."""
    return sum(comb(gpus, k) for k in range(1, min(servers, gpus) + 1))


class PolicyConfig(BaseModel):
    model_config = ConfigDict(allow_inf_nan=False)

    placement: float = Field(100.0, ge=0, le=MAX_WEIGHT, description="Scale-up placement (binpack/spread). Default 100.")
    locality: float = Field(5.0, ge=0, le=MAX_WEIGHT, description="Scale-up model-file locality; 0 disables. Default 5.")
    topology: float = Field(10.0, ge=0, le=MAX_WEIGHT, description="Scale-up GPU interconnect (NVLink, PCIe switch, NUMA node), "
                            "only where some worker reports topology; 0 disables. Default 10.")
    fragmentation: float = Field(200.0, ge=0, le=MAX_WEIGHT, description="Scale-up: a placement on whole GPUs over one in slivers of "
                                 "partly full GPUs (scheduler/scorers/fragmentation.py), only where a decision has both; "
                                 "above the other scale-up weights' sum, so it decides first; 0 disables. Default 200.")
    scale_down_status: float = Field(100.0, ge=0, le=MAX_WEIGHT, description="Scale-down instance/worker status. Default 100.")
    scale_down_offload: float = Field(10.0, ge=0, le=MAX_WEIGHT, description="Scale-down offloaded GGUF layers. Default 10.")
    scale_down_placement: float = Field(1.0, ge=0, le=MAX_WEIGHT, description="Scale-down placement (removal mode). Default 1.")
    max_rpc_servers: int = Field(8, ge=1, le=64, description="GGUF: most RPC servers in one placement; a safety bound on the search (every combination up to it is tried). Default 8.")
    max_rpc_gpus: int = Field(16, ge=1, le=1024, description="GGUF: skip the RPC search above this many RPC-capable GPUs; a safety bound, as GPUStack's. Default 16.")
    foreign_memory_margin: float = Field(0.1, ge=0, le=1, description="Memory that processes gpuflow did not start "
                                         "hold on a GPU (NVML's used less gpuflow's own processes) is kept off the "
                                         "books with this share on top, since such a process grows (a PyTorch cache, "
                                         "a desktop session) and its figure is a sample: 0.1 keeps 11 GiB off for "
                                         "10 GiB used. 0 counts the figure alone. Default 0.1.")

    @model_validator(mode="after")
    def _search_bounded(self) -> "PolicyConfig":
        n = rpc_combinations(self.max_rpc_servers, self.max_rpc_gpus)
        if n > MAX_RPC_COMBINATIONS:
            raise ValueError(f"max_rpc_servers {self.max_rpc_servers} of max_rpc_gpus {self.max_rpc_gpus} would let the "
                             f"GGUF RPC search try {n:,} combinations (at most {MAX_RPC_COMBINATIONS:,}: lower either)")
        return self
