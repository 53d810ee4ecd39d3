#!/usr/bin/python3
"""test_nginx.py — two clocherd behind Debian's nginx agree on adapters (issue 14, "Many
hosts"). Each daemon has its own gRPC socket, HTTP and metrics ports; nginx runs unprivileged (this
user, or nobody when the test runs as root) from a configuration generated in a temporary
folder, round-robin over both:
gRPC through grpc_pass (HTTP/2), the OpenAI API through proxy_pass.
  1. Requests naming ad1, declared in both configurations, are served by both hosts and none
     answers NOT_FOUND (gRPC) or 404 (HTTP); ListAdapters through the balancer says "config".
  2. ad2 added to both configurations and applied with SIGHUP: once each host lists it (source
     "config"), requests naming it through the balancer all succeed, on both hosts.
Exits 77 (a counted skip) when nginx is not installed.
"""
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.environ["CLOCHER_SOURCE_DIR"], "tests", "http"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import fleetlib  # noqa: E402
import grpc  # noqa: E402
import httptest  # noqa: E402
from httptest import gwtest  # noqa: E402

NGINX = shutil.which("nginx") or ("/usr/sbin/nginx" if os.access("/usr/sbin/nginx", os.X_OK)
                                  else None)

SETPRIV = shutil.which("setpriv") or "/usr/bin/setpriv"  # util-linux: to drop root for nginx
NOBODY = 65534

CONF = """
worker_processes 1;
daemon off;
pid {dir}/nginx.pid;
error_log {dir}/error.log info;
events {{ worker_connections 256; }}
http {{
    access_log {dir}/access.log;
    client_body_temp_path {dir}/body;
    proxy_temp_path {dir}/proxy;
    fastcgi_temp_path {dir}/fastcgi;
    uwsgi_temp_path {dir}/uwsgi;
    scgi_temp_path {dir}/scgi;
    upstream clocher_grpc {{ server unix:{sock1}; server unix:{sock2}; }}
    upstream clocher_http {{ server 127.0.0.1:{http1}; server 127.0.0.1:{http2}; }}
    server {{
        listen 127.0.0.1:{gport} http2;
        location / {{ grpc_pass grpc://clocher_grpc; grpc_read_timeout 120s; }}
    }}
    server {{
        listen 127.0.0.1:{hport};
        location / {{
            proxy_pass http://clocher_http;
            proxy_http_version 1.1;
            proxy_buffering off;
            proxy_read_timeout 120s;
        }}
    }}
}}
"""


def start_nginx(d1, d2):
    work = tempfile.mkdtemp(prefix="clocher-nginx-")
    gport, hport = gwtest.free_port(), gwtest.free_port()
    with open(os.path.join(work, "nginx.conf"), "w") as f:
        f.write(CONF.format(dir=work, sock1=d1.sock, sock2=d2.sock, http1=d1.http_port,
                            http2=d2.http_port, gport=gport, hport=hport))
    cmd = []
    if os.geteuid() == 0:
        # never as root: nginx runs as nobody, which must reach the daemons' sockets (in
        # production: nginx's user in clocherd's group, the socket 0660)
        cmd = [SETPRIV, "--reuid=%d" % NOBODY, "--regid=%d" % NOBODY, "--clear-groups", "--"]
        os.chown(work, NOBODY, NOBODY)
        for d in (d1, d2):
            for p in (os.path.dirname(os.path.dirname(d.sock)), os.path.dirname(d.sock)):
                os.chmod(p, 0o711)
            os.chmod(d.sock, 0o666)
    # -e: the error log before the configuration is read (the default is under /var/log)
    proc = subprocess.Popen(cmd + [NGINX, "-p", work, "-c", os.path.join(work, "nginx.conf"),
                             "-e", os.path.join(work, "error.log")],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        httptest.wait_http(gport, timeout=10)
        httptest.wait_http(hport, timeout=10)
    except AssertionError:
        proc.kill()
        raise AssertionError("nginx did not start: %s" % proc.stderr.read().decode())
    return proc, work, gport, hport


def served(d, adapter):
    fams = fleetlib.families(httptest.metrics(d))
    try:
        return fleetlib.sample_sum(fams, "clocher_adapter_generations_total", adapter=adapter)
    except AssertionError:
        return 0


def through_balancer(stub, hport, adapter, n):
    """n gRPC Generates and n HTTP completions naming `adapter`; the statuses seen."""
    md = gwtest.key(httptest.ALICE)
    bad = []
    for i in range(n):
        try:
            ids, _ = gwtest.generate(stub, md, prompt="Tell me %d" % i, max_tokens=3,
                                     adapter=adapter)
            assert ids
        except grpc.RpcError as e:
            bad.append("gRPC %s: %s" % (e.code().name, e.details()))
    front = type("Front", (), {"http_port": hport})()
    for i in range(n):
        st, body, _ = httptest.post(front, "/v1/completions",
                                    {"model": adapter, "prompt": "Say %d" % i, "max_tokens": 3})
        if st != 200:
            bad.append("HTTP %d: %s" % (st, body))
    return bad


def main():
    if not NGINX:
        print("test_nginx: nginx is not installed (Debian's nginx-light): skipped")
        return fleetlib.SKIP
    d1 = httptest.start_daemon()
    d2 = httptest.start_daemon()
    nginx = None
    try:
        nginx, work, gport, hport = start_nginx(d1, d2)
        channel = grpc.insecure_channel("127.0.0.1:%d" % gport)
        stub = gwtest.pb_grpc.InferenceStub(channel)
        md = gwtest.key(httptest.ALICE)

        # 1. the configuration's adapter, through the balancer
        bad = through_balancer(stub, hport, "ad1", 8)
        assert not bad, "requests naming ad1 failed behind nginx: %s" % bad
        n1, n2 = served(d1, "ad1"), served(d2, "ad1")
        assert n1 > 0 and n2 > 0 and n1 + n2 == 16, "ad1 served %s + %s times" % (n1, n2)
        for _ in range(4):
            listed = {a.name: a.source for a in stub.ListAdapters(
                gwtest.pb.ListAdaptersRequest(), metadata=md, timeout=30).adapters}
            assert listed == {"ad1": "config"}, listed

        # 2. a new adapter declared on every host and applied by SIGHUP
        ad2 = gwtest.adapter(gwtest.demo_model(), "ad2", seed=7)
        for d in (d1, d2):
            d.cfg["adapters"]["ad2"] = ad2
            d.write_config()
            d.proc.send_signal(signal.SIGHUP)
        for d in (d1, d2):
            end = time.time() + 60
            while True:
                listed = {a.name: a.source for a in d.stub.ListAdapters(
                    gwtest.pb.ListAdaptersRequest(), metadata=md, timeout=30).adapters}
                if listed.get("ad2") == "config":
                    break
                assert time.time() < end, "ad2 never listed after SIGHUP: %s\n%s" % (
                    listed, d.read_log())
                time.sleep(0.1)
        bad = through_balancer(stub, hport, "ad2", 8)
        assert not bad, "requests naming ad2 failed behind nginx after SIGHUP: %s" % bad
        n1, n2 = served(d1, "ad2"), served(d2, "ad2")
        assert n1 > 0 and n2 > 0 and n1 + n2 == 16, "ad2 served %s + %s times" % (n1, n2)
        channel.close()
        print("test_nginx: ok (ad1 %d+%d, ad2 %d+%d)" % (served(d1, "ad1"), served(d2, "ad1"),
                                                         n1, n2))
        return 0
    except BaseException:
        if nginx:
            with open(os.path.join(work, "error.log")) as f:
                sys.stderr.write("nginx's error log (last lines):\n%s\n" % "".join(
                    f.readlines()[-20:]))
        raise
    finally:
        if nginx:
            nginx.send_signal(signal.SIGQUIT)
            try:
                nginx.wait(20)
            except subprocess.TimeoutExpired:
                nginx.kill()
                nginx.wait()
            shutil.rmtree(work, ignore_errors=True)
        rc1, rc2 = d1.stop(), d2.stop()
        assert rc1 == 0 and rc2 == 0, (rc1, rc2)


if __name__ == "__main__":
    sys.exit(main())
