"""`tokweight store ls|verify`: what a store holds, and whether it is intact."""

from __future__ import annotations

import json

import click


@click.group("store")
def store():
    """Inspect and check a baseline store."""


@store.command("ls")
@click.argument("root", type=click.Path(exists=True, file_okay=False))
@click.option("--json", "as_json", is_flag=True, help="One JSON object per fingerprint.")
def ls(root, as_json):
    """Fingerprints in ROOT with completeness, parts, rows, tokens and skipped samples."""
    from tokweight.store.manifest import damaged_manifest, list_fingerprint_dirs, pending_records, read_manifest

    for directory in list_fingerprint_dirs(root):
        fp = directory.name.split("=", 1)[1]
        damage = damaged_manifest(directory)
        manifest = None if damage else read_manifest(directory)
        pending = len(pending_records(directory, manifest))  # parts finished by a run that has not committed
        if damage:
            info = {"fingerprint": fp, "state": "damaged", "error": damage, "parts_pending": pending}
        elif manifest is None:
            info = {"fingerprint": fp, "state": "uncommitted", "parts_pending": pending}
        else:
            info = {"fingerprint": fp, "state": "complete" if manifest["complete"] else "incomplete",
                    "format": manifest["format"], "parts": len(manifest["parts"]), "inputs": len(manifest["inputs"]),
                    **{k: manifest["stats"][k] for k in ("rows", "tokens", "mean_example_mean_b")},
                    "skipped": manifest["skipped"], "parts_pending": pending}
        if as_json:
            click.echo(json.dumps(info))
        else:
            click.echo("  ".join(f"{k}={v}" for k, v in info.items()))


@store.command("verify")
@click.argument("root", type=click.Path(exists=True, file_okay=False))
@click.option("--fingerprint", default=None, help="Check only this fingerprint (default: every one).")
def verify(root, fingerprint):
    """Check the manifest's own checksum, every part's checksum, rows and tokens against it, and every journal
    record; exit 1 naming each damaged file."""
    from tokweight.store.manifest import fingerprint_dir, list_fingerprint_dirs
    from tokweight.store.verify import verify_dir

    dirs = [fingerprint_dir(root, fingerprint)] if fingerprint else list_fingerprint_dirs(root)
    if not dirs or not all(d.is_dir() for d in dirs):
        raise click.ClickException(f"{root}: no fingerprint directory {fingerprint or ''} to verify")
    bad = 0
    for directory in dirs:
        problems = verify_dir(directory)
        bad += len(problems)
        click.echo(f"{directory.name}: {'ok' if not problems else f'{len(problems)} problem(s)'}")
        for problem in problems:
            click.echo(f"  {problem}")
    if bad:
        raise SystemExit(1)
