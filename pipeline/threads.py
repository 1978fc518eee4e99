"""The `--threads` option every compute command shares, and what it sets."""

from __future__ import annotations

import click


def set_threads(threads: int | None) -> None:
    """torch's intra-op threads: its own choice unless --threads is given (1 is fastest for tiny models on a
    shared 2-core machine; a larger model or machine wants more)."""
    if threads:
        import torch

        torch.set_num_threads(threads)


threads_option = click.option("--threads", type=int, default=None,
                              help="torch threads (default: torch's own choice for this machine).")
