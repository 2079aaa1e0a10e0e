"""What a pool's groups are made of, as a RolloutPool and a simulation scenario both write
them: one model and one set of bounds, so a pool the API admits is one the simulator (and
so the capacity check, which runs it) can take.

Names are snake_case in a scenario and camelCase in a resource; both are accepted.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

# Far above any real device or pool, low enough that no figure overflows a model.
MAX_MEMORY_GB = 100_000
MAX_BANDWIDTH_TB_S = 1_000
MAX_BF16_TFLOPS = 1_000_000
MAX_AFFINITY = 1_000
MAX_PRICE_PER_HOUR = 1_000_000
MAX_TENSOR_PARALLEL = 64

Affinity = Annotated[int, Field(ge=0, le=MAX_AFFINITY)]
PricePerHour = Annotated[float, Field(ge=0, le=MAX_PRICE_PER_HOUR)]
TensorParallel = Annotated[int, Field(ge=1, le=MAX_TENSOR_PARALLEL)]


class CustomAccelerator(BaseModel):
    """An accelerator type the catalog lacks: its figures (estimates)."""

    model_config = ConfigDict(
        extra="forbid",
        frozen=True,
        allow_inf_nan=False,
        alias_generator=to_camel,
        populate_by_name=True,
        use_attribute_docstrings=True,
    )

    memory_gb: float = Field(gt=0, le=MAX_MEMORY_GB)
    """One device's memory, in GB (10^9 bytes)."""
    bandwidth_tb_s: float = Field(gt=0, le=MAX_BANDWIDTH_TB_S)
    """One device's memory bandwidth, in TB/s."""
    bf16_tflops: float = Field(gt=0, le=MAX_BF16_TFLOPS)
    """One device's dense BF16 compute, in TFLOPS."""
