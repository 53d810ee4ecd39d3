#!/usr/bin/env python3
"""tls_test.py — `clocher` over TLS against a real clocherd on stories260K.

openssl makes a throwaway CA, a server certificate for "localhost" and a client certificate at
test time (in a temporary directory). Two daemons: one with tls.cert/tls.key (server TLS), one
that also requires client certificates (tls.client_ca). Checks: health and generate with
--ca (over TCP on a port the kernel picked; the daemons listen on TCP only, since TLS on a
Unix socket is refused at config time: exit 2 naming listen.unix, checked too); a
plaintext client, an unknown CA and a wrong --tls-name are unreachable (exit 5, naming the
address); mutual TLS works with --cert/--key and fails without (exit 5).
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

BUILD = os.environ["CLOCHER_BUILD_DIR"]
FIXTURES = os.environ.get("CLOCHER_FIXTURES", "")
CLOCHER = os.path.join(BUILD, "client", "clocher")
CLOCHERD = os.path.join(BUILD, "daemon", "clocherd")

failures = []
n_checks = 0


def check(cond, what, detail=""):
    global n_checks
    n_checks += 1
    if not cond:
        failures.append(what)
        print(f"FAIL: {what}" + (f"\n    {detail}" if detail else ""), flush=True)
    return cond


def run(args, timeout=60):
    env = {k: v for k, v in os.environ.items() if k not in ("CLOCHER_ADDR", "CLOCHER_API_KEY")}
    p = subprocess.run([CLOCHER] + args, capture_output=True, text=True, env=env,
                       timeout=timeout)
    return p.returncode, p.stdout, p.stderr


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def openssl(*args, cwd):
    subprocess.run(["openssl"] + list(args), cwd=cwd, check=True, capture_output=True)


def make_pki(d):
    """ca.pem, server.pem/server.key (localhost, 127.0.0.1), client.pem/client.key, and
    other-ca.pem (a CA that signed nothing here)."""
    for ca in ("ca", "other-ca"):
        openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj",
                f"/CN=clocher test {ca}", "-keyout", f"{ca}.key", "-out", f"{ca}.pem", cwd=d)
    with open(os.path.join(d, "server.ext"), "w") as f:
        f.write("subjectAltName=DNS:localhost,IP:127.0.0.1\n")
    with open(os.path.join(d, "client.ext"), "w") as f:
        f.write("extendedKeyUsage=clientAuth\n")
    for who, cn in (("server", "localhost"), ("client", "clocher test client")):
        openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={cn}", "-keyout",
                f"{who}.key", "-out", f"{who}.csr", cwd=d)
        openssl("x509", "-req", "-in", f"{who}.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
                "-CAcreateserial", "-days", "2", "-extfile", f"{who}.ext", "-out", f"{who}.pem",
                cwd=d)


def write_config(tmp, name, model, tls, sock=None):
    """The daemon's config file; sock=None listens on TCP only (TLS needs TCP)."""
    tcp = f"127.0.0.1:{free_port()}"
    cfg = {"listen": {"tcp": tcp, "unix": sock}, "metrics": {"listen": None},
           "model_dir": model, "workers": 1, "threads_per_worker": 1, "tls": tls}
    path = os.path.join(tmp, name + ".json")
    with open(path, "w") as f:
        json.dump(cfg, f)
    return path, tcp


def start(tmp, name, model, tls):
    path, tcp = write_config(tmp, name, model, tls)
    log = open(os.path.join(tmp, name + ".log"), "w")
    p = subprocess.Popen([CLOCHERD, "--config", path], stdout=log, stderr=subprocess.STDOUT)
    return p, log, tcp


def stop(p, log, name, tmp):
    if p.poll() is None:
        p.send_signal(signal.SIGTERM)
        try:
            rc = p.wait(timeout=60)
        except subprocess.TimeoutExpired:
            p.kill()
            rc = "killed after 60 s"
        check(rc == 0, f"{name}: clocherd exits 0 after SIGTERM", f"exit {rc}")
    log.close()
    if failures:
        with open(os.path.join(tmp, name + ".log")) as f:
            print(f"---- {name} log ----\n" + f.read()[-4000:])


def main():
    fx = os.path.join(FIXTURES, "stories260K", "stories260K.bin")
    if not os.path.exists(fx):
        print(f"FAIL: fixture {fx} not found (set CLOCHER_FIXTURES)")
        return 1
    tmp = tempfile.mkdtemp(prefix="clocher-tls-")
    if not os.environ.get("CLOCHER_KEEP_TMP"):  # the models it made: gone at exit
        atexit.register(shutil.rmtree, tmp, ignore_errors=True)
    model = os.path.join(tmp, "model")
    subprocess.run([CLOCHER, "convert", fx, model, "--dtype", "f32"], check=True,
                   capture_output=True)
    make_pki(tmp)
    pem = lambda n: os.path.join(tmp, n)
    ca = ["--ca", pem("ca.pem")]
    gen = ["generate", "--prompt-ids", "1 403 407", "--max-tokens", "5", "--temperature", "0",
           "--print-ids"]

    # TLS with a Unix socket is a config error (issue 15 b): exit 2, naming listen.unix
    path, _ = write_config(tmp, "tls-unix", model, {"cert": pem("server.pem"),
                                                    "key": pem("server.key")},
                           sock=os.path.join(tmp, "tls-unix.sock"))
    p = subprocess.run([CLOCHERD, "--config", path], capture_output=True, text=True, timeout=60)
    check(p.returncode == 2 and "listen.unix" in p.stderr + p.stdout,
          "TLS: a Unix socket with TLS is refused at config time (exit 2, names listen.unix)",
          f"{p.returncode} {p.stderr}")

    # server TLS
    d, log, tcp = start(tmp, "tls", model, {"cert": pem("server.pem"),
                                                  "key": pem("server.key")})
    try:
        rc, out, err = run(["health", "--wait", "120", "--addr", tcp] + ca, timeout=150)
        check(rc == 0 and out.strip() == "SERVING", "TLS: health --ca over TCP", f"{rc} {err}")
        rc, out, err = run(gen + ["--addr", tcp] + ca)
        check(rc == 0 and len(out.split()) == 5, "TLS: generate --ca over TCP", f"{rc} {err}")
        rc, out, err = run(["health", "--addr", tcp])
        check(rc == 5 and tcp in err, "TLS: a plaintext client is unreachable (exit 5)",
              f"{rc} {err}")
        rc, out, err = run(["health", "--addr", tcp, "--ca", pem("other-ca.pem")])
        check(rc == 5 and tcp in err and "TLS" in err,
              "TLS: an unknown CA is unreachable (exit 5)", f"{rc} {err}")
        rc, out, err = run(["health", "--addr", tcp, "--tls-name", "elsewhere"] + ca)
        check(rc == 5, "TLS: a wrong --tls-name is unreachable (exit 5)", f"{rc} {err}")
        rc, out, err = run(["health", "--addr", tcp, "--ca", pem("missing.pem")])
        check(rc == 1 and "missing.pem" in err, "TLS: a missing --ca file is named", err)
        rc, out, err = run(["health", "--addr", tcp, "--cert", pem("client.pem")] + ca)
        check(rc == 2 and "--key" in err, "TLS: --cert without --key is a usage error", err)
    finally:
        stop(d, log, "tls", tmp)

    # mutual TLS
    d, log, tcp = start(tmp, "mtls", model, {"cert": pem("server.pem"),
                                                   "key": pem("server.key"),
                                                   "client_ca": pem("ca.pem")})
    try:
        client = ["--cert", pem("client.pem"), "--key", pem("client.key")]
        rc, out, err = run(["health", "--wait", "120", "--addr", tcp] + ca + client, timeout=150)
        check(rc == 0 and out.strip() == "SERVING", "mTLS: health with a client certificate",
              f"{rc} {err}")
        rc, out, err = run(gen + ["--addr", tcp] + ca + client)
        check(rc == 0 and len(out.split()) == 5, "mTLS: generate with a client certificate",
              f"{rc} {err}")
        rc, out, err = run(["health", "--addr", tcp] + ca)
        check(rc in (5, 6), "mTLS: no client certificate is refused", f"{rc} {err}")
    finally:
        stop(d, log, "mtls", tmp)

    subprocess.run(["rm", "-rf", tmp])
    if failures:
        print(f"{len(failures)} check(s) failed")
        return 1
    print(f"tls: all {n_checks} checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
