#!/usr/bin/env python3
"""test-lanes.py: runs the workspace's integration, bench and binary test targets of
`make test` in lanes side by side, each target once, and says how long each took.

The targets are built first, in one `cargo test --no-run` of the whole workspace. Then three
lanes run at once, each target in its lane one after the other. A target's executable runs as
`cargo test` would run it: no arguments, in its package's directory, with
`CARGO_MANIFEST_DIR` and `CARGO_PKG_NAME` set. (Through `cargo test -p PKG` instead, Cargo
would unify the dependencies' features for that package alone and rebuild some of them.)
The lanes:

- `llama`: the targets that drive llama.cpp. Their inference keeps both cores busy, so they
  are one lane and the longest: the others fit beside it.
- `node`: the targets that start the real node (containerd, kubelet, CNI in network
  namespaces). Two real nodes on one machine would share its container runtime, so they take
  turns.
- `rest`: every other target. Each starts its own servers and control plane on ports of its
  own, so it runs beside the others.

A target's whole output is printed when it ends (outputs never interleave; while it runs it
is in a file named at the start), each test with its time (for a test that waits for a
shared server, such as the one llama.cpp server, the wait is part of it), then a line
`[lane] package/target: ok|FAILED in N s`. Last come the targets by time, the slowest tests
and the failed targets. Every target runs even when one failed; the exit status is 1 if any did.
"""

import json
import os
import re
import subprocess
import sys
import threading
import time

CARGO = os.environ.get("CARGO", "cargo")
SELECT = ["--workspace", "--bins", "--test", "*", "--bench", "*", "--examples"]

# (package, target name) -> lane; every other target runs in `rest`.
LANES = {
    ("cairn-agent", "providers"): "llama",
    ("cairn-tests", "real_node"): "node",
    ("cairn-tests", "upgrade"): "node",
    ("cairn-tests", "e2e_demo"): "node",
    ("cairn-gateway", "gateway_real_node"): "node",
}
ORDER = ["llama", "node", "rest"]
KIND_FLAG = {"test": "--test", "bench": "--bench", "bin": "--bin", "example": "--example"}

# libtest's per-test times (`--report-time`) are behind `-Z unstable-options`, which the stable
# toolchain's libtest accepts when RUSTC_BOOTSTRAP=1 is in the test process's environment (set
# there only: the build is done, nothing compiles under it). Test and binary targets use
# libtest; the bench targets have their own harness (`harness = false`) and take no flags.
LIBTEST_TIMES = ["-Z", "unstable-options", "--report-time"]
TIMED = re.compile(r"^test (\S+) \.\.\. (ok|FAILED)[^<]*<([0-9.]+)s>")
SLOWEST = 25

print_lock = threading.Lock()
results = []  # (seconds, lane, package, target, ok)
per_test = []  # (seconds, package/target, test, outcome)

# Each target's output as it runs (read it there while a long target is still going); runs
# older than a day are swept by the harness.
LOGS = os.path.join(
    os.environ.get("CAIRN_CACHE", os.path.expanduser("~/.cache/cairn")),
    "runs",
    f"test-lanes-{os.getpid()}",
)


def targets():
    """The test targets `cargo test` would run: (package, kind, name, executable, directory),
    by package and name."""
    build = subprocess.run(
        [CARGO, "test", *SELECT, "--no-run", "--message-format=json-render-diagnostics"],
        stdout=subprocess.PIPE,
        text=True,
    )
    if build.returncode != 0:
        sys.exit(build.returncode)
    found = []
    for line in build.stdout.splitlines():
        msg = json.loads(line)
        if msg.get("reason") != "compiler-artifact" or not msg.get("executable"):
            continue
        if not msg["profile"]["test"]:
            continue
        kind = msg["target"]["kind"][0]
        if kind == "lib":
            continue  # the unit tier ran before
        package = msg["package_id"]
        # `path+file:///…/agent#cairn-agent@0.1.0` or `…/tests#0.1.0` (name = directory).
        spec = package.rsplit("#", 1)[-1]
        name = spec.split("@")[0] if "@" in spec else package.rsplit("/", 1)[-1].split("#")[0]
        directory = os.path.dirname(msg["manifest_path"])
        found.append((name, kind, msg["target"]["name"], msg["executable"], directory))
    return sorted(set(found))


def run(lane, target):
    package, kind, name, executable, directory = target
    rerun = f"cargo test -p {package} {KIND_FLAG[kind]} {name}"
    env = dict(os.environ, CARGO_MANIFEST_DIR=directory, CARGO_PKG_NAME=package)
    args = [executable]
    if kind in ("test", "bin"):
        env["RUSTC_BOOTSTRAP"] = "1"
        args += LIBTEST_TIMES
    started = time.monotonic()
    log = os.path.join(LOGS, f"{package}-{kind}-{name}.log")
    with open(log, "w") as out:
        code = subprocess.run(
            args, cwd=directory, env=env, stdout=out, stderr=subprocess.STDOUT
        ).returncode
    took = time.monotonic() - started
    ok = code == 0
    with open(log, errors="replace") as out:
        output = out.read()
    tests = [
        (float(m[3]), f"{package}/{name}", m[1], m[2])
        for m in map(TIMED.match, output.splitlines())
        if m
    ]
    with print_lock:
        results.append((took, lane, package, name, ok))
        per_test.extend(tests)
        print(f"\n--- [{lane}] {package}/{name} ({rerun}: {executable})", flush=True)
        sys.stdout.write(output)
        print(f"[{lane}] {package}/{name}: {'ok' if ok else 'FAILED'} in {took:.0f} s", flush=True)


def lane_worker(lane, queue):
    for target in queue:
        run(lane, target)


def main():
    started = time.monotonic()
    os.makedirs(LOGS, exist_ok=True)
    print(f"each target's output as it runs: {LOGS}", flush=True)
    queues = {lane: [] for lane in ORDER}
    for target in targets():
        queues[LANES.get((target[0], target[2]), "rest")].append(target)
    threads = [
        threading.Thread(target=lane_worker, args=(lane, queues[lane]))
        for lane in ORDER
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.monotonic() - started
    print("\n=== test targets by time")
    for took, lane, package, name, ok in sorted(results, reverse=True):
        print(f"{took:7.0f} s  {lane:5}  {package}/{name}{'' if ok else '  FAILED'}")
    for lane in ORDER:
        busy = sum(r[0] for r in results if r[1] == lane)
        print(f"lane {lane}: {busy:.0f} s")
    print(f"\n=== the {SLOWEST} slowest of {len(per_test)} timed tests")
    for took, target, test, outcome in sorted(per_test, reverse=True)[:SLOWEST]:
        print(f"{took:7.1f} s  {target}  {test}{'' if outcome == 'ok' else '  ' + outcome}")
    failed = [f"{p}/{n}" for _, _, p, n, ok in results if not ok]
    print(f"{len(results)} targets in {wall:.0f} s; failed: {', '.join(failed) or 'none'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
