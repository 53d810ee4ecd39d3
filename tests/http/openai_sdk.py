"""The HTTP API through the official `openai` npm package (the SDK users' tools are built on):
installs it into the build folder given as argv[1] (npm, the registry: when either is missing
this exits 77, which ctest counts as skipped), starts a clocherd (httptest.start_daemon) and runs
openai_sdk.mjs against it: streamed and unstreamed chat and completions, an adapter by name,
the SDK's error classes for 400/401/404/413/429, and an aborted stream cancelling its request.
"""
import json
import os
import shutil
import subprocess
import sys

SKIP = 77
OPENAI_VERSION = "4"  # the major version the script is written against


def install(folder):
    if not shutil.which("npm") or not shutil.which("node"):
        print("SKIP: node or npm is not installed")
        sys.exit(SKIP)
    if os.path.exists(os.path.join(folder, "node_modules", "openai", "package.json")):
        return
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "package.json"), "w") as f:
        json.dump({"name": "clocher-http-test", "private": True}, f)
    p = subprocess.run(["npm", "install", "--no-audit", "--no-fund", "--silent",
                        "openai@" + OPENAI_VERSION], cwd=folder, capture_output=True, text=True,
                       timeout=240)
    if p.returncode != 0:
        print("SKIP: npm install openai failed (no network or registry?):\n" + p.stderr[-2000:])
        sys.exit(SKIP)


def main():
    folder = sys.argv[1]
    install(folder)
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import httptest as ht
    d = ht.start_daemon()
    try:
        env = dict(os.environ, NODE_PATH=os.path.join(folder, "node_modules"),
                   CLOCHER_HTTP="http://127.0.0.1:%d/v1" % d.http_port,
                   CLOCHER_METRICS="http://127.0.0.1:%d/metrics" % d.metrics_port,
                   CLOCHER_MODEL=d.model_name, CLOCHER_KEY=ht.ALICE, CLOCHER_KEY_BOB=ht.BOB,
                   CLOCHER_PID=str(d.proc.pid))
        script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "openai_sdk.mjs")
        # an .mjs resolves packages from its own folder: run a copy beside node_modules
        shutil.copy(script, os.path.join(folder, "openai_sdk.mjs"))
        p = subprocess.run(["node", os.path.join(folder, "openai_sdk.mjs")], env=env,
                           timeout=180)
        rc = p.returncode
        if rc == 0:
            d.terminated = True  # the last case (drain503) sent the SIGTERM
    finally:
        if d.stop() != 0:
            rc = 1
    sys.exit(1 if rc else 0)


if __name__ == "__main__":
    main()
