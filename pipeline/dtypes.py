"""The dtypes a backbone's forward may run in, named once; imports nothing, so the CLI stays light."""

FORWARD_DTYPES = ("float32", "bfloat16", "float16")
