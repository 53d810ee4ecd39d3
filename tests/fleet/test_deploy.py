#!/usr/bin/python3
"""test_deploy.py — deploy/ without Docker or a cluster: the Dockerfile, the container's
configuration, the Kubernetes manifests and the Grafana dashboard parse, and what they name
agrees with clocherd:
  - the probes (grpc.health.v1 on the gRPC port, HTTP /healthz on the metrics port) and the
    HEALTHCHECK name the ports the container's configuration listens on, which are clocherd's
    defaults (daemon/config.c) on every interface, and the path the metrics endpoint serves;
  - the image runs as a non-root user, the same uid the Deployment asks for;
  - both configurations pass `clocherd --check-config` (with a model directory of their own,
    stories260K from CLOCHER_FIXTURES);
  - the InferencePool selects the Deployment's pods on the HTTP port, its InferenceModels name
    the pool and adapters the configuration declares;
  - every dashboard panel has PromQL on the dashboard's data-source variable, ids are unique.
Exits 77 (a counted skip) when PyYAML is missing.
"""
import json
import os
import re
import subprocess
import sys
import tempfile

SOURCE = os.environ["CLOCHER_SOURCE_DIR"]
BUILD = os.environ.get("CLOCHER_BUILD_DIR", "")
DEPLOY = os.path.join(SOURCE, "deploy")


def fail(msg):
    print("test_deploy: FAIL: " + msg, file=sys.stderr)
    sys.exit(1)


def check(cond, msg):
    if not cond:
        fail(msg)


def read(*p):
    with open(os.path.join(*p)) as f:
        return f.read()


def port_of(hostport):
    return int(hostport.rsplit(":", 1)[1])


def defaults():
    """clocherd's default gRPC and metrics ports and its health path, from the source."""
    cfg = read(SOURCE, "daemon", "config.c")
    tcp = re.search(r'#define DEF_LISTEN_TCP "([^"]+)"', cfg)
    met = re.search(r'#define DEF_METRICS "([^"]+)"', cfg)
    check(tcp and met, "daemon/config.c no longer defines DEF_LISTEN_TCP / DEF_METRICS")
    check('"/healthz"' in read(SOURCE, "daemon", "metrics.c"),
          "daemon/metrics.c no longer serves /healthz")
    return port_of(tcp.group(1)), port_of(met.group(1))


def check_config(cfg, what):
    """clocherd --check-config on cfg, its model_dir pointed at stories260K converted by
    `clocher convert` (--check-config checks the model folder too) and its adapter folders at
    empty folders of our own."""
    clocherd = os.path.join(BUILD, "daemon", "clocherd")
    clocher = os.path.join(BUILD, "client", "clocher")
    fx = os.path.join(os.environ.get("CLOCHER_FIXTURES", ""), "stories260K", "stories260K.bin")
    if not os.access(clocherd, os.X_OK) or not os.access(clocher, os.X_OK):
        return
    check(os.path.exists(fx), "fixture %s not found (set CLOCHER_FIXTURES)" % fx)
    with tempfile.TemporaryDirectory() as d:
        cfg = dict(cfg, model_dir=os.path.join(d, "model"))
        subprocess.run([clocher, "convert", fx, cfg["model_dir"], "--dtype", "f32"], check=True,
                       capture_output=True)
        for name in cfg.get("adapters", {}):
            cfg["adapters"][name] = os.path.join(d, name)
            os.mkdir(cfg["adapters"][name])
        path = os.path.join(d, "c.json")
        with open(path, "w") as f:
            json.dump(cfg, f)
        p = subprocess.run([clocherd, "--check-config", "--config", path], capture_output=True,
                           text=True)
        check(p.returncode == 0, "%s: clocherd --check-config refuses it:\n%s%s" % (
            what, p.stdout, p.stderr))


def main():
    try:
        import yaml
    except ImportError:
        print("test_deploy: PyYAML (python3-yaml) is missing: skipped")
        return 77
    grpc_port, metrics_port = defaults()

    # --- Dockerfile ---
    df = read(DEPLOY, "Dockerfile")
    froms = re.findall(r"^FROM\s+(\S+)", df, re.M)
    check(froms and all(f.startswith("debian:12") for f in froms), "FROM lines: %s" % froms)
    check("scripts/install-deps.sh" in df and os.path.exists(
        os.path.join(SOURCE, "scripts", "install-deps.sh")), "the build must use install-deps.sh")
    user = re.findall(r"^USER\s+(\S+)", df, re.M)
    check(user and user[-1].split(":")[0] not in ("0", "root"), "USER: %s" % user)
    uid = int(user[-1].split(":")[0])
    check(re.search(r"useradd[^\n]*--uid %d" % uid, df), "uid %d is not created" % uid)
    hc = re.search(r"^HEALTHCHECK(?:[^\n]*\\\n)*[^\n]*", df, re.M)
    check(hc, "no HEALTHCHECK")
    check("http://127.0.0.1:%d/healthz" % metrics_port in hc.group(0),
          "HEALTHCHECK does not ask /healthz on port %d: %s" % (metrics_port, hc.group(0)))
    exposed = {int(p) for line in re.findall(r"^EXPOSE\s+(.+)$", df, re.M) for p in line.split()}
    for src in re.findall(r"^COPY\s+(?!--from)(\S+)\s", df, re.M):
        check(src == "." or os.path.exists(os.path.join(SOURCE, src)), "COPY %s: no such file" % src)
    dcfg = json.loads(read(DEPLOY, "docker", "clocherd.json"))
    check(port_of(dcfg["listen"]["tcp"]) == grpc_port, "container gRPC port")
    check(port_of(dcfg["metrics"]["listen"]) == metrics_port, "container metrics port")
    for l in (dcfg["listen"]["tcp"], dcfg["metrics"]["listen"], dcfg["http"]["listen"]):
        check(l.startswith("0.0.0.0:"), "a container listens on every interface, not %s" % l)
    check(exposed == {grpc_port, metrics_port, port_of(dcfg["http"]["listen"])},
          "EXPOSE %s" % exposed)
    check_config(dcfg, "deploy/docker/clocherd.json")

    # --- Kubernetes ---
    docs = [d for d in yaml.safe_load_all(read(DEPLOY, "kubernetes", "clocherd.yaml")) if d]
    by_kind = {d["kind"]: d for d in docs}
    check(set(by_kind) == {"ConfigMap", "Deployment", "Service"}, "kinds %s" % set(by_kind))
    kcfg = json.loads(by_kind["ConfigMap"]["data"]["clocherd.json"])
    check_config(kcfg, "the ConfigMap's clocherd.json")
    kgrpc, kmet = port_of(kcfg["listen"]["tcp"]), port_of(kcfg["metrics"]["listen"])
    khttp = port_of(kcfg["http"]["listen"])
    check((kgrpc, kmet) == (grpc_port, metrics_port), "ConfigMap ports %s" % ((kgrpc, kmet),))
    dep = by_kind["Deployment"]
    pod = dep["spec"]["template"]
    check(dep["spec"]["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items(),
          "the Deployment's selector does not match its pods")
    sc = pod["spec"]["securityContext"]
    check(sc.get("runAsNonRoot") is True and sc.get("runAsUser") == uid,
          "pod securityContext %s (the image's uid is %d)" % (sc, uid))
    (c,) = pod["spec"]["containers"]
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    check(ports == {"grpc": kgrpc, "http": khttp, "metrics": kmet}, "containerPorts %s" % ports)
    check(c["readinessProbe"]["grpc"]["port"] == kgrpc, "readiness probe: grpc.health.v1 on %d"
          % kgrpc)
    for probe in ("livenessProbe", "startupProbe"):
        g = c[probe]["httpGet"]
        check(g["path"] == "/healthz" and g["port"] == kmet, "%s: %s" % (probe, g))
    check(c["args"][-1].startswith("/etc/clocherd/") and any(
        m["mountPath"] == "/etc/clocherd" for m in c["volumeMounts"]), "config mount")
    check(pod["spec"]["terminationGracePeriodSeconds"] > kcfg.get("drain_timeout_s", 30),
          "terminationGracePeriodSeconds must exceed drain_timeout_s")
    svc = by_kind["Service"]
    check(svc["spec"]["selector"].items() <= pod["metadata"]["labels"].items(), "Service selector")
    for p in svc["spec"]["ports"]:
        check(p["targetPort"] in ports, "Service port %s targets no container port" % p)

    pool_docs = [d for d in yaml.safe_load_all(read(DEPLOY, "kubernetes", "inferencepool.yaml"))
                 if d]
    pools = [d for d in pool_docs if d["kind"] == "InferencePool"]
    check(len(pools) == 1, "one InferencePool")
    pool = pools[0]
    check(pool["spec"]["targetPortNumber"] == khttp, "the pool's targetPortNumber is the HTTP port")
    check(pool["spec"]["selector"].items() <= pod["metadata"]["labels"].items(), "pool selector")
    for m in (d for d in pool_docs if d["kind"] == "InferenceModel"):
        check(m["spec"]["poolRef"]["name"] == pool["metadata"]["name"], "poolRef of %s" % m)
        for t in m["spec"].get("targetModels", []):
            check(t["name"] in kcfg["adapters"], "InferenceModel target %s is not an adapter of "
                  "the configuration (every pod must have it)" % t["name"])

    # --- Grafana ---
    dash = json.loads(read(DEPLOY, "grafana", "clocher.json"))
    ids, n_targets = set(), 0
    for p in dash["panels"]:
        check(p["id"] not in ids, "duplicate panel id %s" % p["id"])
        ids.add(p["id"])
        if p["type"] == "row":
            continue
        check(p["targets"], "panel %r has no query" % p["title"])
        for t in p["targets"]:
            check(t["expr"].strip() and t["datasource"]["uid"] == "${datasource}",
                  "panel %r: target %s" % (p["title"], t))
            n_targets += 1
    check(any(v["name"] == "datasource" for v in dash["templating"]["list"]), "no datasource var")
    print("test_deploy: ok (%d dashboard queries; ports grpc %d, http %d, metrics %d)" % (
        n_targets, kgrpc, khttp, kmet))
    return 0


if __name__ == "__main__":
    sys.exit(main())
