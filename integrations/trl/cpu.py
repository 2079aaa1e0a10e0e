"""TRL's AsyncGRPOTrainer on a machine with no CUDA: two of its GPU assumptions replaced.

TRL 1.16 always trains with its "tree_fa3" attention (packed samples that share a prompt
are forwarded once), whose kernel is flash-attention 3 fetched from the Hugging Face hub,
and asks `torch.cuda` for the device's peak FLOPs while it is constructed. `run_on_cpu()`
registers a pure-torch tree attention under the same name (the same masks, computed
segment by segment with `scaled_dot_product_attention`; slower, for small models) and
reports no peak FLOPs (TRL then logs no MFU). Call it once before constructing the
trainer, whose config takes `CPU_SETTINGS`. On a GPU machine, do not: TRL's kernel is the
fast path."""

from __future__ import annotations

from typing import Any

import torch
from transformers import AttentionInterface, AttentionMaskInterface


def torch_tree_attention(
    module: Any,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: Any,
    *,
    tree_kv_index: torch.Tensor,
    tree_cu_seqlens_q: torch.Tensor,
    tree_cu_seqlens_k: torch.Tensor,
    tree_max_seqlen_q: int,
    tree_max_seqlen_k: int,
    scaling: float | None = None,
    sliding_window: int | None = None,
    softcap: float | None = None,
    **_: Any,
) -> tuple[torch.Tensor, None]:
    """TRL's `packing.tree_attention` in plain torch: each segment's queries attend,
    causally and aligned to the end, to the keys of its path through the prefix tree."""
    if sliding_window or softcap:
        raise NotImplementedError("the torch tree attention has no sliding window or softcap")
    q, k, v = (x.transpose(1, 2)[0] for x in (query, key, value))  # (tokens, heads, dim)
    k, v = k.index_select(0, tree_kv_index), v.index_select(0, tree_kv_index)
    if q.shape[1] != k.shape[1]:  # grouped-query attention
        k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
        v = v.repeat_interleave(q.shape[1] // v.shape[1], dim=1)
    out = torch.empty_like(q)
    starts_q, starts_k = tree_cu_seqlens_q.tolist(), tree_cu_seqlens_k.tolist()
    for s in range(len(starts_q) - 1):
        qs = q[starts_q[s] : starts_q[s + 1]]
        ks, vs = k[starts_k[s] : starts_k[s + 1]], v[starts_k[s] : starts_k[s + 1]]
        mask = torch.ones(qs.shape[0], ks.shape[0], dtype=torch.bool, device=q.device)
        mask = mask.tril(diagonal=ks.shape[0] - qs.shape[0])
        attended = torch.nn.functional.scaled_dot_product_attention(
            qs.transpose(0, 1),
            ks.transpose(0, 1),
            vs.transpose(0, 1),
            attn_mask=mask,
            scale=scaling,
        )
        out[starts_q[s] : starts_q[s + 1]] = attended.transpose(0, 1)
    return out.unsqueeze(0), None


def register_torch_tree_attention() -> None:
    AttentionInterface.register("tree_fa3", torch_tree_attention)
    AttentionMaskInterface.register("tree_fa3", lambda **_: None)


# The AsyncGRPOConfig settings a machine without CUDA needs: no bf16, no pinned memory.
CPU_SETTINGS = {
    "use_cpu": True,
    "bf16": False,
    "gradient_checkpointing": False,
    "dataloader_pin_memory": False,
}


def run_on_cpu() -> None:
    """Let `AsyncGRPOTrainer` be built and train on a machine without CUDA."""
    import trl.experimental.async_grpo.async_grpo_trainer as trainer  # noqa: PLC0415

    trainer.register_tree_attention = register_torch_tree_attention  # type: ignore[attr-defined]
    trainer.get_peak_flops_per_device = lambda accelerator, dtype: None  # type: ignore[attr-defined]
