"""Text <-> tokens for the model a worker serves and its trainer trains: both read the
same Hugging Face tokenizer from the model's folder."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path


class Vocabulary:
    """Text <-> tokens for the model a worker serves (its Hugging Face tokenizer)."""

    def __init__(self, model_path: Path) -> None:
        # transformers is heavy to import; a worker without tools never needs it here.
        from transformers import AutoTokenizer  # noqa: PLC0415

        self._tokenizer = AutoTokenizer.from_pretrained(model_path)
        self.eos_token_id: int | None = self._tokenizer.eos_token_id

    def decode(self, token_ids: Sequence[int]) -> str:
        return str(self._tokenizer.decode(list(token_ids), skip_special_tokens=True))

    def encode(self, text: str) -> list[int]:
        return list(self._tokenizer.encode(text, add_special_tokens=False))
