"""Checkpoint fingerprints: what makes a stored baseline valid for a model (docs/contract.md §4).

sha256 over canonical JSON of the model config (with defaults), the vocabulary, the
template version, and every parameter tensor (name, dtype, shape, raw little-endian
bytes). Any change of one of them changes the fingerprint; nothing random goes in.
"""

from __future__ import annotations

import hashlib
import json
from typing import Mapping

import torch

FINGERPRINT_VERSION = 1


def canonical_json(obj) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False).encode()


def tensor_bytes(t: torch.Tensor) -> bytes:
    """Raw little-endian bytes of a CPU copy; bfloat16 has no numpy dtype, so view as int16."""
    t = t.detach().to("cpu").contiguous()
    if t.dtype == torch.bfloat16:
        t = t.view(torch.int16)
    a = t.numpy()
    return a.astype(a.dtype.newbyteorder("<"), copy=False).tobytes()


def fingerprint(*, model_config: Mapping, tokens: list[str], template_version: str,
                tensors: Mapping[str, torch.Tensor]) -> str:
    if not tensors:
        raise ValueError("cannot fingerprint a model without tensors")
    h = hashlib.sha256()
    h.update(canonical_json({"fingerprint_version": FINGERPRINT_VERSION, "model_config": dict(model_config),
                             "tokens": list(tokens), "template_version": template_version}))
    for name in sorted(tensors):
        t = tensors[name]
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"cannot fingerprint {name!r}: {type(t).__name__} is not a tensor")
        h.update(canonical_json({"name": name, "dtype": str(t.dtype), "shape": list(t.shape)}))
        h.update(tensor_bytes(t))
    return h.hexdigest()[:32]
