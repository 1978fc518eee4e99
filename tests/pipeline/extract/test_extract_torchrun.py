"""Scale-out: `torchrun --nproc-per-node 2` (gloo, CPU) writes the same store as one process."""

import json
import os
import signal
import subprocess
import sys

import pytest

from tests.support.fixtures_extract import fp_dir, part_bytes

TIMEOUT_S = 120


def _run_with_hard_timeout(cmd, env):
    """Run a launcher in its own process group; on timeout SIGTERM it (it ends its workers), then SIGKILL the group."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGTERM)
        try:
            out, _ = proc.communicate(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, _ = proc.communicate()
        pytest.fail(f"torchrun did not finish within {TIMEOUT_S} s:\n{out.decode(errors='replace')[-3000:]}")
    return proc.returncode, out.decode(errors="replace")


def test_two_process_torchrun_equals_one_process(world, tmp_path):
    store = tmp_path / "s"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           "-m", "tokweight.cli", "extract", "--checkpoint", str(world.ckpt), "--data", str(world.data),
           "--store", str(store), "--no-progress"]
    env = {**os.environ, "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1", "OMP_NUM_THREADS": "1"}
    code, out = _run_with_hard_timeout(cmd, env)
    assert code == 0, out[-3000:]
    assert part_bytes(store) == part_bytes(world.store)  # part for part, byte for byte
    ours = json.loads((fp_dir(store) / "manifest.json").read_text())
    ref = json.loads((fp_dir(world.store) / "manifest.json").read_text())
    for field in ("parts", "inputs", "stats", "skipped", "fingerprint", "complete"):
        assert ours[field] == ref[field], field
    records = {p.name: p.read_bytes() for p in sorted(fp_dir(store).glob("part-*.json"))}
    assert len(records) == 6  # the journal, folded into the manifest and kept, as one process writes it
    assert records == {p.name: p.read_bytes() for p in sorted(fp_dir(world.store).glob("part-*.json"))}
