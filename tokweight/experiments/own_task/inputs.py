"""A researcher's own task: the checks on checkpoint, data and store, the store extracted once, and what
the store predicts before any CVAE is trained.

Each check fails with one line naming the file or key and what to do (the CLI prints it as
``Error: ...``). The dataset's key hashes every shard's split, name, size and sha256, so an
edited shard gives new cells; the store is extract's own (a complete store for the checkpoint's
fingerprint over the same shards does nothing, a stale or missing one is written). A dataset
given by URLs (pipeline.data.urls) splits by URL prefix, and its key takes each shard's size and
sha256 from the store, which took them as the shard streamed.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from tokweight.report.tables import fixed
from tokweight.experiments.artefacts import LOCK_WAIT_S, Echo, Prepared, data_key, key_of

SPLITS = ("train", "val", "test")
"""The CVAE trains on train, validates on val and is reported on test."""
SETTING = "own"
"""The name a user task's cells and runs go by (the synthetic grid names its settings)."""
PROFILE_POSITIONS = 12
"""Positions of S shown in the report's surprisal profile."""


def dataset(data: str) -> Path | str:
    """``--data`` as the experiment passes it on: a local folder as a Path, URLs as they are."""
    from tokweight.pipeline.data.urls import is_url_data

    return data if is_url_data(data) else Path(data)


def split_shards(data: Path | str) -> dict[str, list[Path] | list[str]]:
    """split -> its shards (``data/<split>/**/*.tar``, or the URLs named ``<split>/...``); a split that is
    missing or empty is refused."""
    out = {}
    for split in SPLITS:
        if isinstance(data, str):
            from tokweight.pipeline.data.shards import resolve_shards, shard_name

            root, urls = resolve_shards(data)
            shards, where = [u for u in urls if shard_name(root, u).startswith(f"{split}/")], f"{root}{split}/"
        else:
            shards, where = sorted((data / split).rglob("*.tar")) if (data / split).is_dir() else [], data / split
        if not shards:
            raise ValueError(f"{data} has no {split!r} split with shards ({where}): the experiment trains on "
                             f"train, validates on val and reports on test; convert with --val-fraction and "
                             f"--test-fraction above 0, or with a --split-field naming all of {', '.join(SPLITS)}")
        out[split] = shards
    return out


def latent_k(data: Path | str, k: int | None) -> int:
    """K: ``k`` if given, else the number of the data's strategy labels (train appends the latent tokens a
    checkpoint lacks)."""
    from tokweight.pipeline.data.labels import load_labels

    labels = load_labels(data).strategies
    if k is None and len(labels) < 2:
        meta = data / "dataset.json" if isinstance(data, Path) else f"the dataset.json of {data}"
        raise ValueError(f"{meta} lists {len(labels)} strategy label(s), so K is unknown: pass "
                         "--k K (the latent's number of values), or give the JSON lines a 'strategy' field")
    return len(labels) if k is None else k


def check_store(store: Path, fingerprint: str, checkpoint: str) -> None:
    """A store given by the user must be new or already hold this checkpoint's fingerprint: one of another
    checkpoint means the wrong --store or the wrong --checkpoint."""
    held = sorted(p.name.removeprefix("fingerprint=") for p in store.glob("fingerprint=*")) if store.is_dir() else []
    if held and fingerprint not in held:
        raise ValueError(f"store {store} holds fingerprint(s) {', '.join(held)}, not {fingerprint} of checkpoint "
                         f"{checkpoint}: pass the store extracted with this checkpoint, or leave out --store to "
                         "extract into OUT/store")


def extract_store(checkpoint: Checkpoint, data: Path, store: Path) -> bool:
    """Write (or finish) the checkpoint's store over every split; True if it was complete already. Another job
    extracting the same store is waited for (``LOCK_WAIT_S``)."""
    from tokweight.pipeline.extract.config import ExtractConfig
    from tokweight.pipeline.extract.extract import run as extract

    done = extract(ExtractConfig(checkpoint=checkpoint.path, data=str(data), store=str(store),
                                 template=checkpoint.template, progress=False, lock_wait_s=LOCK_WAIT_S))
    return done["nothing_to_do"]


@dataclass(frozen=True)
class Checkpoint:
    """What the experiment reads off the user's checkpoint."""

    path: str
    fingerprint: str
    kind: str
    """"tokweight" or "huggingface"."""
    parameters: int
    template: str
    """The format it is read in (extract's ``--template``: "tokweight", "chat" or a template file)."""


def read_checkpoint(path: str, template: str) -> Checkpoint:
    from tokweight.pipeline.models.backbone import load_backbone
    from tokweight.pipeline.tokens.templates import template_option

    ckpt = load_backbone(path, template=template_option(template))
    return Checkpoint(path, ckpt.fingerprint, ckpt.meta.get("kind", "tokweight"),  # hf: "huggingface"
                      sum(p.numel() for p in ckpt.model.parameters()), template)


# ---------------------------------------------------------------- what the store predicts


def data_connection(store: Path, fingerprint: str, shards: list[Path]):
    """A DuckDB connection over the store (store.sql) whose views read only these shards' parts: a store may
    also hold what the checkpoint scored of other data."""
    from tokweight.store.baseline_store import BaselineStore
    from tokweight.store.sql import connect

    view = BaselineStore(store).open(fingerprint)
    return connect(store, [fingerprint], shards={view.input_for_shard(p)["name"] for p in shards})


def predictions(con) -> dict:
    """The store's headline numbers over this data (store/sql/summary.sql): dilution, T/(t0+1), effective
    tokens, the gain ratio if z removed every b."""
    from tokweight.store.sql import read_sql

    row = con.sql(read_sql("summary")).to_arrow_table().to_pylist()[0]
    keep = ("examples", "tokens", "mean_T", "mean_b", "mean_example_mean_b", "mean_dilution", "mean_amplification",
            "mean_amplification_true", "with_true_t0", "t0_share_exact", "mean_effective_tokens",
            "gain_ratio_if_z_removes_b")
    return {k: row[k] for k in keep}


def profile(con) -> list[dict]:
    """Mean b and mean share pi per position of S, the first PROFILE_POSITIONS (store/sql/profile_by_position.sql)."""
    from tokweight.store.sql import read_sql

    rows = con.sql(read_sql("profile_by_position")).to_arrow_table().to_pylist()
    return [{k: r[k] for k in ("pos", "n", "mean_b", "mean_pi")} for r in rows[:PROFILE_POSITIONS]]


def predicted_beta_c(con) -> dict[str, float | None]:
    """weighting -> beta_c predicted from the store (store/sql/predicted_beta_c.sql: the z-gain over its KL
    cost H(label)); None where no example carries a label."""
    from tokweight.store.inspection import predicted_beta_c as predicted

    return {r["weighting"]: r["beta_c_predicted"] for r in predicted(con)}


def base_nll(store: Path, fingerprint: str, test: list[Path]) -> float:
    """The base model's token-mean NLL on the test split: mean over examples of mean_t b_t, the quantity a
    cell's recon_uniform measures for its decoder."""
    from tokweight.store.baseline_store import BaselineStore

    return BaselineStore(store).open(fingerprint).mean_example_mean_b(test)


def content_key(data: Path | str, shards: dict[str, list], store: Path, fingerprint: str) -> str:
    """``artefacts.data_key``; for URLs from the store's entries (name, size and sha256 of the bytes streamed),
    which were read as the shards streamed, so that no shard is read again."""
    if isinstance(data, Path):
        return data_key(data, shards)
    from tokweight.store.baseline_store import BaselineStore

    view = BaselineStore(store).open(fingerprint)
    entries = {split: [view.input_for_shard(url) for url in urls] for split, urls in shards.items()}
    return key_of({split: [[e["name"], e["size"], e["sha256"]] for e in listed] for split, listed in entries.items()})


def prepare(checkpoint: Checkpoint, data: Path | str, store: Path, echo: Echo) -> Prepared:
    """Store extracted (or found complete), the dataset keyed, the store's predictions over it: the
    ``Prepared`` every cell reads (no generator setting: a user task has none)."""
    start = time.perf_counter()
    shards = split_shards(data)
    reused = extract_store(checkpoint, data, store)
    con = data_connection(store, checkpoint.fingerprint, [p for paths in shards.values() for p in paths])
    stats = {**predictions(con), "profile": profile(con), "beta_c_predicted": predicted_beta_c(con),
             "base_nll_test": base_nll(store, checkpoint.fingerprint, shards["test"])}
    stats |= {"ratio_true": stats["mean_amplification_true"], "ratio_inspect": stats["mean_amplification"]}
    echo(f"[store] {checkpoint.fingerprint[:12]}: {'complete already' if reused else 'extracted'}; "
         f"{stats['examples']} examples, dilution (t0+1)/T {fixed(stats['mean_dilution'])}, base token-mean "
         f"NLL on test {fixed(stats['base_nll_test'])} nats ({time.perf_counter() - start:.0f} s)")
    key = content_key(data, shards, store, checkpoint.fingerprint)
    return Prepared(None, data, key, Path(checkpoint.path), checkpoint.fingerprint, store, stats)
