#!/usr/bin/env python3
"""sync-tree.py SRC DEST: makes DEST hold exactly the files of the git work tree SRC (tracked,
and untracked but not ignored, as they are in the work tree), copying only the files whose
content or mode differs. Unchanged files keep their modification times, so cargo building in
DEST recompiles only what changed since the last sync, whichever clone it came from."""

import os
import shutil
import stat
import subprocess
import sys


def same_file(s: str, d: str) -> bool:
    try:
        ss, ds = os.stat(s), os.lstat(d)
    except FileNotFoundError:
        return False
    if not stat.S_ISREG(ds.st_mode) or ss.st_size != ds.st_size:
        return False
    if stat.S_IMODE(ss.st_mode) != stat.S_IMODE(ds.st_mode):
        return False
    with open(s, "rb") as a, open(d, "rb") as b:
        while True:
            x, y = a.read(1 << 20), b.read(1 << 20)
            if x != y:
                return False
            if not x:
                return True


def main() -> int:
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    src, dest = (os.path.abspath(p) for p in sys.argv[1:3])
    listed = subprocess.run(
        ["git", "-C", src, "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        check=True,
        capture_output=True,
    ).stdout.decode()
    want = set()
    copied = 0
    for rel in filter(None, listed.split("\0")):
        s, d = os.path.join(src, rel), os.path.join(dest, rel)
        if not os.path.lexists(s):
            continue  # deleted in the work tree, not yet in the index
        want.add(rel)
        if os.path.islink(s):
            target = os.readlink(s)
            if os.path.islink(d) and os.readlink(d) == target:
                continue
            if os.path.lexists(d):
                os.remove(d)
            os.makedirs(os.path.dirname(d), exist_ok=True)
            os.symlink(target, d)
            copied += 1
        elif not same_file(s, d):
            if os.path.isdir(d) and not os.path.islink(d):
                shutil.rmtree(d)
            os.makedirs(os.path.dirname(d), exist_ok=True)
            tmp = d + ".sync-tmp"
            shutil.copyfile(s, tmp)
            shutil.copymode(s, tmp)
            os.replace(tmp, d)
            copied += 1
    removed = 0
    for root, dirs, files in os.walk(dest, topdown=False):
        for f in files:
            p = os.path.join(root, f)
            if os.path.relpath(p, dest) not in want:
                os.remove(p)
                removed += 1
        for sub in dirs:
            p = os.path.join(root, sub)
            if os.path.islink(p):
                if os.path.relpath(p, dest) not in want:
                    os.remove(p)
                    removed += 1
            elif not os.listdir(p):
                os.rmdir(p)
    print(f"{len(want)} files, {copied} copied, {removed} removed", file=sys.stderr)
    print(dest)
    return 0


if __name__ == "__main__":
    sys.exit(main())
