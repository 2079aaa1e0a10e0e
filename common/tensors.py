"""A model's weights as one file holds them, tied tensors once.

Many models tie their output layer to their input embeddings: one tensor under two names.
A safetensors file cannot hold it twice, and an exported checkpoint (Hugging Face's, or
what TRL sends each weight sync) names it once, as its first name. `weights_of` writes a
model that way and `load_weights` reads such a file strictly in every other respect:
a name the model does not have, or a tensor it has that is neither given nor tied to one
given, is refused by name."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


class WeightsMismatch(ValueError):
    """Weights that do not fit the model, named."""


def weights_of(model: Any) -> dict[str, Any]:
    """The model's state, each tied tensor once (under its first name), on the CPU."""
    seen: set[int] = set()
    out = {}
    for name, tensor in model.state_dict().items():
        if tensor.data_ptr() in seen:
            continue
        seen.add(tensor.data_ptr())
        out[name] = tensor.detach().contiguous().cpu()
    return out


def load_weights(model: Any, weights: Mapping[str, Any]) -> None:
    """Copy `weights` into `model`: every tensor of the model must be given, or tied to
    one given; checked before anything is copied."""
    state = model.state_dict()
    unexpected = sorted(set(weights) - set(state))
    given = {state[name].data_ptr() for name in weights if name in state}
    missing = sorted(n for n, t in state.items() if n not in weights and t.data_ptr() not in given)
    if unexpected or missing:
        said = []
        if missing:
            said.append(f"missing {', '.join(missing[:3])}" + (" ..." if len(missing) > 3 else ""))
        if unexpected:
            said.append(
                f"unknown {', '.join(unexpected[:3])}" + (" ..." if len(unexpected) > 3 else "")
            )
        raise WeightsMismatch(f"the weights do not fit the model: {'; '.join(said)}")
    model.load_state_dict(dict(weights), strict=False)
