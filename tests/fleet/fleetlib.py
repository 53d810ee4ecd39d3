"""fleetlib — what the fleet tests share: the Prometheus text of a live clocherd parsed into
families and samples (Debian's python3-prometheus-client), promtool when it is installed, and
the PromQL of the shipped Grafana dashboard with its variables made concrete.
"""
import json
import os
import re
import shutil
import subprocess
import tempfile

from prometheus_client.parser import text_string_to_metric_families

SKIP = 77  # ctest's SKIP_RETURN_CODE for these tests
SOURCE = os.environ.get("CLOCHER_SOURCE_DIR", "")
DASHBOARD = os.path.join(SOURCE, "deploy", "grafana", "clocher.json")


def families(text):
    """{family name: (type, [(sample name, labels dict, value)])} of a scrape."""
    out = {}
    for fam in text_string_to_metric_families(text):
        out[fam.name] = (fam.type, [(s.name, dict(s.labels), s.value) for s in fam.samples])
    return out


def sample_sum(fams, name, **labels):
    total, seen = 0.0, False
    for _, samples in fams.values():
        for n, lab, v in samples:
            if n == name and all(lab.get(k) == x for k, x in labels.items()):
                total, seen = total + v, True
    assert seen, "no sample %s%s in the scrape" % (name, labels or "")
    return total


def promtool():
    return shutil.which("promtool")


def promtool_check_metrics(text):
    """promtool's lint of an exposition; raises with its complaints. The vllm:* names carry a
    colon because vLLM's do and routers read them by those names; promtool's lint reserves
    colons for recording rules (a convention; the text format allows them), so that one
    complaint is accepted for vllm:* families only, and the same text with the colon made an
    underscore must pass clean: every other rule holds for them too."""
    p = subprocess.run([promtool(), "check", "metrics"], input=text, capture_output=True,
                       text=True)
    out = (p.stdout + p.stderr).splitlines()
    other = [l for l in out if not re.fullmatch(r"vllm:\S+ metric names should not contain ':'", l)]
    # exit 3: lint complaints only (1: the text did not parse)
    assert p.returncode in (0, 3) and not other, "promtool check metrics failed (%d):\n%s" % (
        p.returncode, "\n".join(out))
    p = subprocess.run([promtool(), "check", "metrics"], input=text.replace("vllm:", "vllm_"),
                       capture_output=True, text=True)
    assert p.returncode == 0, "promtool check metrics failed:\n%s%s" % (p.stdout, p.stderr)


# Grafana's variables, made concrete so PromQL tools can read the expressions
_VARS = {"$__rate_interval": "5m", "$__interval": "1m", "$__range": "1h", "$job": ".*",
         "$instance": ".*"}


def dashboard_exprs(path=DASHBOARD):
    """[(panel title, concrete PromQL)] of every panel target, rows' nested panels included."""
    with open(path) as f:
        dash = json.load(f)
    out = []

    def walk(panels):
        for p in panels:
            walk(p.get("panels", []))
            for t in p.get("targets", []):
                e = t["expr"]
                for k in sorted(_VARS, key=len, reverse=True):
                    e = e.replace(k, _VARS[k])
                assert "$" not in e, "panel %r: an unknown variable in %s" % (p["title"], e)
                out.append((p["title"], e))

    walk(dash["panels"])
    return out


_FUNCS = {"sum", "rate", "increase", "histogram_quantile", "max", "min", "avg", "count", "by",
          "without", "on", "ignoring", "irate", "topk", "bottomk", "le", "and", "or", "unless"}


def metric_names(expr):
    """The metric names an expression reads: identifiers (colons allowed) not followed by '('
    and outside label matchers and strings."""
    e = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)      # strings
    e = re.sub(r"\{[^}]*\}", "{}", e)                  # label matchers
    e = re.sub(r"\[[^\]]*\]", "[]", e)                 # ranges
    e = re.sub(r"\b(by|without|on|ignoring)\s*\([^)]*\)", "", e)  # grouping labels
    names = set()
    for m in re.finditer(r"[a-zA-Z_:][a-zA-Z0-9_:]*", e):
        tail = e[m.end():].lstrip()
        word = m.group(0)
        if tail.startswith("(") or word in _FUNCS or re.fullmatch(r"\d.*", word):
            continue
        names.add(word)
    return names


def promtool_check_exprs(exprs):
    """Parses every expression with promtool (as recording rules); raises naming the bad one."""
    d = tempfile.mkdtemp(prefix="clocher-promql-")
    path = os.path.join(d, "rules.yml")
    with open(path, "w") as f:
        f.write("groups:\n- name: dashboard\n  rules:\n")
        for i, (_, e) in enumerate(exprs):
            f.write("  - record: clocher:dashboard_%d\n    expr: %s\n" % (i, json.dumps(e)))
    p = subprocess.run([promtool(), "check", "rules", path], capture_output=True, text=True)
    shutil.rmtree(d, ignore_errors=True)
    assert p.returncode == 0, "promtool check rules (the dashboard's PromQL) failed:\n%s%s" % (
        p.stdout, p.stderr)
