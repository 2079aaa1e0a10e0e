"""A tiny random-weight Llama with a tokenizer trained here, for tests, `cadence run` on a
laptop and vLLM on CPU. Nothing can be fetched from a model hub on these machines, and
nothing needs to be: the shapes below are the smallest vLLM's CPU attention accepts
(head_dim 64: vLLM's CPU attention kernels take no smaller).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

# Text the tokenizer learns its merges from: the reference environment's calculator
# format and plain arithmetic, so prompts of the toy task tokenise compactly.
_CORPUS = [
    "What is 12 + 7? The answer is 19.",
    "Compute 3 * 4 and give the result: 12.",
    "<tool>calc 18 / 3</tool><result>6</result> so the answer is \\boxed{6}.",
    "Add the numbers 5, 9 and 11 to get 25.",
    "The final number is 42.",
] * 20 + [" ".join(str(i) for i in range(n, n + 40)) for n in range(0, 400, 40)]


def make_tiny_llama(
    path: Path,
    *,
    vocab_size: int = 1024,
    seed: int = 0,
    max_positions: int = 4096,
    tie_embeddings: bool = False,
) -> Path:
    """Write a random-weight LlamaForCausalLM (2 layers, hidden 128, 2 heads of 64, one KV
    head, `max_positions` long; its output layer tied to its input embeddings with
    `tie_embeddings`, as many small chat models are) and its tokenizer into `path`;
    returns `path`."""
    path.mkdir(parents=True, exist_ok=True)
    bpe = Tokenizer(models.BPE(unk_token="<unk>"))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()  # so decoded text has spaces, not "Ġ"
    specials = ["<unk>", "<s>", "</s>", "<pad>"]
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    bpe.train_from_iterator(_CORPUS, trainer)
    tokenizer = PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
        tokenizer_object=bpe,
        unk_token="<unk>",
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
    )
    tokenizer.save_pretrained(path)

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=64,
        max_position_embeddings=max_positions,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=tie_embeddings,
    )
    model: Any = LlamaForCausalLM(config)  # type: ignore[no-untyped-call,unused-ignore]
    model = model.to(torch.bfloat16)
    model.save_pretrained(path, safe_serialization=True)
    return path
