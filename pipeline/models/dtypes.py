"""The dtypes a backbone's forward may run in, named once; imports nothing at module level, so the CLI stays light.

"auto" is every command's default: bfloat16 on a CUDA device, float32 elsewhere (so a CPU run computes what it
always computed)."""

FORWARD_DTYPES = ("float32", "bfloat16", "float16")
DTYPE_CHOICES = ("auto",) + FORWARD_DTYPES
TRAIN_DTYPES = ("auto", "float32", "bfloat16")


def resolve_dtype(dtype: str, device) -> str:
    """``dtype`` with "auto" resolved for ``device`` (a torch device or its name): "bfloat16" on CUDA, else
    "float32"; any other name as given."""
    if dtype not in DTYPE_CHOICES:
        raise ValueError(f"dtype must be one of {DTYPE_CHOICES}, got {dtype!r}")
    if dtype != "auto":
        return dtype
    return "bfloat16" if str(device).startswith("cuda") else "float32"


def torch_dtype(name: str):
    """The torch dtype of a resolved name."""
    import torch

    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[name]
