"""KV snapshots through clocherd (issue 16): with "kv_snapshot" a worker saves its hottest
prefixes when it stops and restores them when it starts, a respawned worker too, so a prompt
served before a restart is a prefix-cache hit on the first request after it; a bad, foreign or
truncated snapshot file is ignored with a warning naming it and the worker starts empty.
"""
import os
import signal
import time

import pytest

import gwtest as T

MD = T.key("alice-key-0001")
PROMPT = [1] + [100 + (7 * i) % 200 for i in range(150)]  # 151 tokens: 9 whole 16-token blocks


@pytest.fixture(scope="module")
def stories():
    return T.stories_model()


def cached(d, ids=PROMPT):
    toks, last = T.generate(d.stub, MD, ids=ids, max_tokens=4)
    assert len(toks) == 4
    return last.usage.cached_prompt_tokens


def daemon(model, snap_dir, **kw):
    return T.Daemon(model, workers=1, extra={"kv_snapshot": {"path": snap_dir}}, **kw)


def saved_snapshot(model, snap_dir):
    """A daemon that serves PROMPT once and stops: the worker's snapshot file."""
    d = daemon(model, snap_dir)
    try:
        assert cached(d) == 0  # a cold cache
    finally:
        assert d.stop() == 0, d.read_log()
    path = os.path.join(snap_dir, "worker-0.kvsnap")
    assert os.path.getsize(path) > 0, d.read_log()
    assert "kv snapshot %s: saved" % path in d.read_log(), d.read_log()
    return path


def test_restart_restores_the_served_prefix(stories, tmp_path):
    snap = str(tmp_path)
    path = saved_snapshot(stories, snap)
    d = daemon(stories, snap)
    try:
        log = d.read_log()
        assert "restored" in log and path in log, log
        # the first request after the restart: its prompt's whole blocks come from the snapshot
        assert cached(d) >= 144, d.read_log()
        # a worker replaced after a crash restores the file too (saved at the last stop)
        pid = d.worker_pids()[0]
        os.kill(pid, signal.SIGKILL)
        end = time.time() + 60
        while time.time() < end and d.worker_pids().get(0) in (None, pid):
            time.sleep(0.1)
        assert d.worker_pids().get(0) not in (None, pid), d.read_log()
        d.wait_serving()
        other = [1] + [300 + i for i in range(40)]
        assert cached(d, other) == 0  # not in the snapshot
        assert cached(d) >= 144, d.read_log()
    finally:
        assert d.stop() == 0, d.read_log()


@pytest.mark.parametrize("damage", ["truncated", "garbage", "foreign"])
def test_a_bad_snapshot_is_ignored_naming_it(stories, tmp_path, damage):
    snap = str(tmp_path)
    path = os.path.join(snap, "worker-0.kvsnap")
    model = stories
    if damage == "foreign":
        saved_snapshot(T.demo_model(), snap)  # another model's cache
        why = "made for model fingerprint"
    else:
        saved_snapshot(stories, snap)
        with open(path, "r+b") as f:
            if damage == "truncated":
                f.truncate(os.path.getsize(path) // 2)
                why = "truncated"
            else:
                f.write(b"not a KV snapshot at all" * 4)
                why = "bad magic"
    d = daemon(model, snap)
    try:
        log = d.read_log()
        assert "kv snapshot %s ignored" % path in log and why in log, log
        assert cached(d) == 0  # started empty, serving
    finally:
        assert d.stop() == 0, d.read_log()


def test_kv_snapshot_config_is_checked(stories, tmp_path):
    import subprocess
    for snap, why in ((str(tmp_path / "nowhere"), "kv_snapshot.path"),
                      (None, "kv_snapshot.path: is required")):
        cfg = tmp_path / "c.json"
        ks = '{"path": "%s"}' % snap if snap else '{"max_mb": 4}'
        cfg.write_text('{"model_dir": "%s", "listen": {"tcp": null, "unix": "%s"}, '
                       '"kv_snapshot": %s}' % (stories, tmp_path / "s", ks))
        p = subprocess.run([T.CLOCHERD, "--config", str(cfg)], capture_output=True, text=True,
                           timeout=60)
        assert p.returncode != 0
        assert why in p.stderr, p.stderr
