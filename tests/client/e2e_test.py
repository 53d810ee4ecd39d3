#!/usr/bin/env python3
"""e2e_test.py — every `clocher` online command against a real clocherd serving stories260K.

The test converts the stories260K fixture to IEBIN and makes a LoRA adapter for it (in a
temporary directory), starts clocherd on a Unix socket there (plus a TCP port the kernel picked
for one check), with two tenants, then checks:
  health (--wait, --service), generate (greedy tokens equal llama2.c's reference, --json, the
  error statuses and exit codes: no key, bad key, bad value, forbidden adapter), batch (JSONL
  round trip in input order, per-line errors, results equal to single generates), adapters
  (list, load, use, unload, unload again), metrics (GetMetrics, and --http when the metrics
  endpoint exists), bench (a small run, JSON report), and SIGTERM: clocherd exits 0, and the
  client then reports it unreachable (exit 5).
stories260K has no tokenizer, so prompts are token ids.
"""
import atexit
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

BUILD = os.environ["CLOCHER_BUILD_DIR"]
SRC = os.environ["CLOCHER_SOURCE_DIR"]
FIXTURES = os.environ.get("CLOCHER_FIXTURES", "")
CLOCHER = os.path.join(BUILD, "client", "clocher")
CLOCHERD = os.path.join(BUILD, "daemon", "clocherd")
KEY1 = "key-one-0123456789"   # tenant "all": every adapter, may load/unload
KEY2 = "key-two-0123456789"   # tenant "base": no adapter

failures = []
n_checks = 0


def check(cond, what, detail=""):
    global n_checks
    n_checks += 1
    if not cond:
        failures.append(what)
        print(f"FAIL: {what}" + (f"\n    {detail}" if detail else ""), flush=True)
    return cond


def run(args, key=KEY1, addr=None, stdin=None, timeout=120):
    env = dict(os.environ)
    env.pop("CLOCHER_API_KEY", None)
    env["CLOCHER_ADDR"] = addr or ADDR
    if key:
        env["CLOCHER_API_KEY"] = key
    p = subprocess.run([CLOCHER] + args, input=stdin, capture_output=True, text=True, env=env,
                       timeout=timeout)
    return p.returncode, p.stdout, p.stderr


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def reference_greedy(golden, n):
    """llama2.c's greedy continuation of golden case 0, cut where its margin is thin."""
    case = golden["cases"][0] if isinstance(golden, dict) and "cases" in golden else golden[0]
    greedy, margin = case["greedy"], case["greedy_margin"]
    k = 0
    while k < min(n, len(greedy)) and margin[k] >= 0.01:
        k += 1
    return case["prompt"], greedy[:k]


def main():
    global ADDR
    fx = os.path.join(FIXTURES, "stories260K", "stories260K.bin")
    if not os.path.exists(fx):
        print(f"FAIL: fixture {fx} not found (set CLOCHER_FIXTURES)")
        return 1
    with open(os.path.join(FIXTURES, "stories260K", "golden.json")) as f:
        golden = json.load(f)
    tmp = tempfile.mkdtemp(prefix="clocher-e2e-")
    if not os.environ.get("CLOCHER_KEEP_TMP"):  # the models it made: gone at exit
        atexit.register(shutil.rmtree, tmp, ignore_errors=True)
    model, ad1, ad2 = (os.path.join(tmp, x) for x in ("model", "ad1", "ad2"))
    subprocess.run([CLOCHER, "convert", fx, model, "--dtype", "f32"], check=True,
                   capture_output=True)
    for d, seed in ((ad1, 1), (ad2, 2)):
        subprocess.run([CLOCHER, "synth-adapter", model, d, "--rank", "4", "--seed", str(seed),
                        "--strength", "0.5"], check=True, capture_output=True)
    sock = os.path.join(tmp, "d.sock")
    ADDR = "unix:" + sock
    tcp = f"127.0.0.1:{free_port()}"
    have_metrics = os.path.exists(os.path.join(SRC, "daemon", "metrics.c"))
    mport = free_port()
    cfg = {
        "listen": {"tcp": tcp, "unix": sock},
        "metrics": {"listen": f"127.0.0.1:{mport}" if have_metrics else None},
        "model_dir": model,
        "workers": 1,
        "threads_per_worker": 1,
        "adapters": {"a1": ad1},
        "tenants": [
            {"name": "all", "api_keys": [KEY1], "allowed_adapters": "*"},
            {"name": "base", "api_keys": [KEY2], "allowed_adapters": []},
        ],
        "supervisor": {"heartbeat_timeout_s": 120},
    }
    with open(os.path.join(tmp, "clocherd.json"), "w") as f:
        json.dump(cfg, f)
    log = open(os.path.join(tmp, "clocherd.log"), "w")
    d = subprocess.Popen([CLOCHERD, "--config", os.path.join(tmp, "clocherd.json")],
                         stdout=log, stderr=subprocess.STDOUT)
    try:
        body(golden, tmp, ad2, tcp, have_metrics, mport)
    finally:
        if d.poll() is None:
            d.send_signal(signal.SIGTERM)
            try:
                rc = d.wait(timeout=60)
            except subprocess.TimeoutExpired:
                d.kill()
                rc = "killed after 60 s"
            check(rc == 0, "clocherd exits 0 after SIGTERM", f"exit {rc}")
        log.close()
        if failures:
            with open(os.path.join(tmp, "clocherd.log")) as f:
                print("---- clocherd log ----\n" + f.read()[-6000:])
    # the daemon is gone: unreachable, exit 5, naming the address
    rc, out, err = run(["health"])
    check(rc == 5 and ADDR in err, "health after the daemon stopped: exit 5 naming the address",
          f"rc {rc}: {err}")
    subprocess.run(["rm", "-rf", tmp])
    if failures:
        print(f"{len(failures)} check(s) failed")
        return 1
    print(f"e2e: all {n_checks} checks passed")
    return 0


def ids_of(out):
    return [int(x) for x in out.split()]


def body(golden, tmp, ad2, tcp, have_metrics, mport):
    # ---- health ----
    rc, out, err = run(["health", "--wait", "120"], timeout=150)
    if not check(rc == 0 and out.strip() == "SERVING", "health --wait: SERVING",
                 f"rc {rc}: {out} {err}"):
        return
    rc, out, err = run(["health", "--service", "clocher.v1.Inference"])
    check(rc == 0 and out.strip() == "SERVING", "health --service clocher.v1.Inference", err)
    rc, out, err = run(["health", "--service", "nope"])
    check(rc == 6 and "NOT_FOUND" in err, "health --service unknown: exit 6 NOT_FOUND", err)
    rc, out, err = run(["health", "--addr", tcp])
    check(rc == 0 and out.strip() == "SERVING", "health over TCP", err)

    # ---- generate: greedy tokens equal llama2.c's ----
    prompt, want = reference_greedy(golden, 30)
    pid = " ".join(map(str, prompt))
    rc, out, err = run(["generate", "--prompt-ids", pid, "--temperature", "0", "--max-tokens",
                        "30", "--print-ids"])
    got = ids_of(out) if rc == 0 else []
    check(rc == 0 and len(got) == 30 and got[:len(want)] == want and len(want) > 0,
          "generate greedy == llama2.c reference", f"rc {rc}, got {got}, want {want}: {err}")
    greedy = got

    rc, out, err = run(["generate", "--prompt-ids", pid, "--temperature", "0", "--max-tokens",
                        "8", "--json", "--addr", tcp])
    try:
        j = json.loads(out)
    except ValueError:
        j = {}
    check(rc == 0 and j.get("token_ids") == greedy[:8] and j.get("finish_reason") == "length"
          and j.get("usage", {}).get("completion_tokens") == 8
          and j.get("usage", {}).get("prompt_tokens") == len(prompt),
          "generate --json over TCP", f"rc {rc}: {out} {err}")

    rc, out, err = run(["generate", "--prompt-ids", pid, "--temperature", "0.8", "--seed", "7",
                        "--max-tokens", "12", "--print-ids"])
    rc2, out2, _ = run(["generate", "--prompt-ids", pid, "--temperature", "0.8", "--seed", "7",
                        "--max-tokens", "12", "--print-ids"])
    check(rc == 0 and rc2 == 0 and out == out2 and len(ids_of(out)) == 12,
          "generate with a seed is reproducible", f"{out} / {out2} {err}")

    rc, out, err = run(["generate", "--prompt-ids", pid, "--temperature", "0", "--max-tokens",
                        "12", "--adapter", "a1", "--print-ids"])
    check(rc == 0 and len(ids_of(out)) == 12, "generate --adapter a1", err)
    with_adapter = ids_of(out) if rc == 0 else []

    rc, out, err = run(["generate", "--prompt-ids", pid, "-v", "--max-tokens", "4"])
    check(rc == 0 and "no text" in err and "finish: length" in err,
          "generate without a tokenizer says so; -v summary", err)

    for args, key, code, needle, what in (
        ([], None, "UNAUTHENTICATED", "", "no API key"),
        ([], "wrong-key-0123456", "UNAUTHENTICATED", "", "unknown API key"),
        (["--temperature", "-1"], KEY1, "INVALID_ARGUMENT", "temperature", "temperature < 0"),
        (["--top-p", "1.5"], KEY1, "INVALID_ARGUMENT", "top_p", "top_p > 1"),
        (["--adapter", "a1"], KEY2, "NOT_FOUND", "a1", "a forbidden adapter"),
        (["--adapter", "zz"], KEY1, "NOT_FOUND", "zz", "an unknown adapter"),
        (["--max-tokens", "100000000"], KEY1, "INVALID_ARGUMENT", "max_tokens",
         "max_tokens over the limit"),
        (["--timeout", "0.000001"], KEY1, "DEADLINE_EXCEEDED", "", "a deadline that passed"),
    ):
        rc, out, err = run(["generate", "--prompt-ids", pid] + args, key=key)
        check(rc == 6 and code in err and needle in err, f"generate, {what}: exit 6 {code}",
              f"rc {rc}: {err}")
    rc, out, err = run(["generate", "hello"])
    check(rc == 6 and "tokenizer" in err, "generate text on a model without tokenizer", err)

    # ---- batch: JSONL round trip in input order ----
    lines = [
        {"prompt_ids": prompt, "max_tokens": 10, "temperature": 0},
        {"prompt_ids": prompt, "max_tokens": 5, "temperature": 0, "adapter": "a1"},
        {"prompt_ids": prompt, "temprature": 0},                       # unknown key
        {"prompt_ids": prompt, "max_tokens": 3, "temperature": -2},    # the daemon refuses it
        {"prompt_ids": [1, 403, 407], "max_tokens": 7, "temperature": 0.7, "seed": 3},
    ]
    text = "\n".join(json.dumps(x) for x in lines[:2]) + "\n\n" + \
        "\n".join(json.dumps(x) for x in lines[2:]) + "\n"
    inp = os.path.join(tmp, "in.jsonl")
    with open(inp, "w") as f:
        f.write(text)
    rc, out, err = run(["batch", inp, "--chunk", "2"])
    res = [json.loads(x) for x in out.splitlines()]
    check(rc == 1 and [r.get("index") for r in res] == [0, 1, 2, 3, 4],
          "batch: one line per request, in input order, exit 1 (some failed)",
          f"rc {rc}: {out} {err}")
    if len(res) == 5:
        check(res[0].get("token_ids") == greedy[:10], "batch line 0 == generate", str(res[0]))
        check(res[1].get("token_ids") == with_adapter[:5], "batch line 1 (adapter) == generate",
              str(res[1]))
        check(res[2].get("error", {}).get("code") == "INVALID_ARGUMENT"
              and "temprature" in res[2]["error"]["message"]
              and "line 4" in res[2]["error"]["message"], "batch: a bad line named", str(res[2]))
        check(res[3].get("error", {}).get("code") == "INVALID_ARGUMENT"
              and "temperature" in res[3]["error"]["message"], "batch: a refused request",
              str(res[3]))
        rc2, out2, _ = run(["generate", "--prompt-ids", "1 403 407", "--max-tokens", "7",
                            "--temperature", "0.7", "--seed", "3", "--print-ids"])
        check(res[4].get("token_ids") == ids_of(out2) and res[4].get("finish_reason") == "length",
              "batch line 4 (seeded) == generate", f"{res[4]} / {out2}")
    good = "\n".join(json.dumps(x) for x in (lines[0], lines[4])) + "\n"
    rc, out, err = run(["batch", "-o", os.path.join(tmp, "out.jsonl"), "--max-tokens", "4"],
                       stdin=good)
    with open(os.path.join(tmp, "out.jsonl")) as f:
        res = [json.loads(x) for x in f.read().splitlines()]
    check(rc == 0 and len(res) == 2 and len(res[0]["token_ids"]) == 10
          and len(res[1]["token_ids"]) == 7, "batch from stdin to -o, all ok: exit 0",
          f"rc {rc}: {res} {err}")
    rc, out, err = run(["batch"], key=None, stdin=good)
    check(rc == 6 and "UNAUTHENTICATED" in err, "batch without a key: exit 6", err)

    # ---- adapters ----
    rc, out, err = run(["adapters", "list"])
    check(rc == 0 and any(l.split()[0] == "a1" for l in out.splitlines()[1:]),
          "adapters list shows a1", f"{out} {err}")
    rc, out, err = run(["adapters", "list", "--json"])
    try:
        listed = [json.loads(x) for x in out.splitlines()]
    except ValueError:
        listed = []
    check(rc == 0 and any(a["name"] == "a1" and a["rank"] == 4 for a in listed),
          "adapters list --json", out)
    rc, out, err = run(["adapters", "list"], key=KEY2)
    check(rc == 0 and len(out.splitlines()) == 1, "adapters list: none for tenant base", out)
    rc, out, err = run(["adapters", "load", "a2", ad2], key=KEY2)
    check(rc == 6 and "PERMISSION_DENIED" in err, "adapters load by tenant base: refused", err)
    rc, out, err = run(["adapters", "load", "a2", ad2])
    check(rc == 0 and "loaded a2" in out, "adapters load a2", f"{out} {err}")
    rc, out, err = run(["adapters", "load", "a2", ad2])
    check(rc == 6 and "ALREADY_EXISTS" in err, "adapters load a2 twice: ALREADY_EXISTS", err)
    rc, out, err = run(["generate", "--prompt-ids", pid, "--adapter", "a2", "--max-tokens", "6",
                        "--print-ids"])
    check(rc == 0 and len(ids_of(out)) == 6, "generate with the loaded adapter", err)
    rc, out, err = run(["adapters", "unload", "a2"])
    check(rc == 0 and "unloaded a2" in out, "adapters unload a2", err)
    rc, out, err = run(["adapters", "list"])
    check(rc == 0 and "a2" not in out, "adapters list without a2", out)
    rc, out, err = run(["adapters", "unload", "a2"])
    check(rc == 6 and "NOT_FOUND" in err, "adapters unload a2 again: NOT_FOUND", err)

    # ---- metrics ----
    rc, out, err = run(["metrics"])
    check(rc == 0 and "clocher_requests_total" in out and 'method="Generate"' in out,
          "metrics (GetMetrics)", f"rc {rc}: {out[:300]} {err}")
    if have_metrics:
        rc, out, err = run(["metrics", "--http", f"127.0.0.1:{mport}"])
        check(rc == 0 and "clocher_requests_total" in out, "metrics --http", f"rc {rc}: {err}")

    # ---- bench ----
    rc, out, err = run(["bench", "--prompt-ids", pid, "--max-tokens", "8", "-c", "3", "-n", "12",
                        "--warmup", "5", "--json"])
    try:
        b = json.loads(out)
    except ValueError:
        b = {}
    check(rc == 0 and b.get("requests") == 12 and b.get("ok") == 12 and b.get("tokens") == 96
          and b.get("ttft_ms", {}).get("n") == 12 and b["ttft_ms"]["p50"] <= b["ttft_ms"]["p99"]
          and b.get("server_ttft_ms", {}).get("n") == 12
          and 0 < b["server_ttft_ms"]["p50"] <= b["ttft_ms"]["p50"]
          and b.get("errors") == {}, "bench -c 3 -n 12 --warmup 5 --json (warm-up not counted)",
          f"rc {rc}: {out} {err}")
    rc, out, err = run(["bench", "--prompt-ids", pid, "--max-tokens", "4", "-c", "2", "-d", "1"])
    check(rc == 0 and "requests/s" in out and "p99" in out, "bench -d 1 (text report)", out)
    rc, out, err = run(["bench", "--prompt-ids", pid, "--temperature", "-1", "-n", "3", "--json"])
    try:
        b = json.loads(out)
    except ValueError:
        b = {}
    check(rc == 6 and b.get("failed") == 3 and b.get("errors") == {"INVALID_ARGUMENT": 3},
          "bench counts errors by status: exit 6", f"rc {rc}: {out}")


if __name__ == "__main__":
    sys.exit(main())
