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
