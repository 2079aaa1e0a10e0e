"""The body of every 4xx/5xx answer, in a module of its own.

Wire schemas (a worker's API, the trainer's) name it in their answers; keeping it apart
from `web.py` lets them, and the commands that read only schemas, load without the web
framework.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Problem(BaseModel):
    """Every 4xx/5xx body: one sentence a person can act on."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    error: str
    reason: str
