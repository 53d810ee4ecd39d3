"""ops_install — what `cmake --install` puts on a machine (issue 14): the programs, the
license, the .proto files a client generates its code from, the systemd unit and every
manual its Documentation= names; and a release tree configured with -DCLOCHER_TESTS=OFF
(which needs no test-only library such as cmocka) registers no test.
"""
import os
import re
import shutil
import subprocess
import tempfile

BUILD = os.environ["CLOCHER_BUILD_DIR"]
SOURCE = os.environ["CLOCHER_SOURCE_DIR"]


def test_install_has_what_the_unit_and_clients_need():
    prefix = tempfile.mkdtemp(prefix="clocher-install-")
    try:
        p = subprocess.run(["cmake", "--install", BUILD, "--prefix", prefix],
                           capture_output=True, text=True, timeout=300)
        assert p.returncode == 0, p.stdout + p.stderr
        for rel in ("bin/clocher", "bin/inference-engine", "sbin/clocherd",
                    "libexec/clocher/clocher-worker",
                    "share/clocher/proto/clocher/v1/inference.proto",
                    "share/clocher/proto/grpc/health/v1/health.proto",
                    "share/clocher/proto/grpc/reflection/v1/reflection.proto",
                    "share/doc/clocher/LICENSE", "share/doc/clocher/examples/clocherd.json",
                    "lib/systemd/system/clocherd.service", "lib/sysusers.d/clocherd.conf",
                    "lib/tmpfiles.d/clocherd.conf"):
            assert os.path.exists(os.path.join(prefix, rel)), rel
        with open(os.path.join(prefix, "lib/systemd/system/clocherd.service")) as f:
            unit = f.read()
        docs = re.findall(r"^Documentation=(.*)$", unit, re.M)
        assert docs, "the unit names no Documentation="
        for url in " ".join(docs).split():
            if url.startswith("man:"):
                continue
            assert url.startswith("file:/usr/"), url
            path = os.path.join(prefix, url[len("file:/usr/"):])
            assert os.path.isfile(path), "Documentation=%s is not installed" % url
    finally:
        shutil.rmtree(prefix, ignore_errors=True)


def test_a_tree_without_tests_configures_without_cmocka():
    tree = tempfile.mkdtemp(prefix="clocher-notests-")
    try:
        p = subprocess.run(["cmake", "-S", SOURCE, "-B", tree, "-DCLOCHER_TESTS=OFF",
                            "-DCMAKE_BUILD_TYPE=Release"], capture_output=True, text=True,
                           timeout=300)
        assert p.returncode == 0, p.stdout + p.stderr
        with open(os.path.join(tree, "CMakeCache.txt")) as f:
            cache = f.read()
        assert "CMOCKA_FOUND" not in cache, "cmocka was looked for with the tests off"
        assert not os.path.exists(os.path.join(tree, "tests")), "tests configured anyway"
    finally:
        shutil.rmtree(tree, ignore_errors=True)


def test_the_example_key_is_not_a_word():
    """The example configuration's key hash is not that of a guessable word."""
    import hashlib
    import json
    with open(os.path.join(SOURCE, "systemd", "clocherd.json")) as f:
        cfg = json.load(f)
    words = ["foo", "bar", "test", "example", "secret", "password", "changeme", "key", "admin",
             "clocher", "demo", "alice", ""]
    weak = {"sha256:" + hashlib.sha256(w.encode()).hexdigest() for w in words}
    for t in cfg["tenants"]:
        for k in t["api_keys"]:
            assert k.startswith("sha256:"), "the example holds a plain key: %s" % k
            assert k not in weak, "the example key is the hash of a word"
