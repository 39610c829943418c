package integration

// swapProbe flips a path between a regular file and a symlink to a host
// path (and a directory between a real one and a symlink to a host
// directory) for argv[3] seconds, as fast as it can, with atomic renames.
// argv[1] is the host file, argv[2] the host directory.
const swapProbe = `
import os, shutil, sys, time
target, target_dir, secs = sys.argv[1], sys.argv[2], float(sys.argv[3])
w = "/workspace"
os.makedirs(w + "/swapdir-real", exist_ok=True)
with open(w + "/swapdir-real/canary", "w") as f:
    f.write("jail-side file")

def place(link_target, dest):
    tmp = dest + ".tmp"
    try:
        os.unlink(tmp)
    except FileNotFoundError:
        pass
    os.symlink(link_target, tmp)
    while True:
        try:
            os.rename(tmp, dest)
            return
        except (IsADirectoryError, OSError):
            # A PUT made dest a real directory in the meantime.
            shutil.rmtree(dest, ignore_errors=True)

end = time.time() + secs
n = 0
while time.time() < end:
    with open(w + "/.swap-file", "w") as f:
        f.write("jail-side file")
    try:
        os.rename(w + "/.swap-file", w + "/swap")
    except OSError:
        shutil.rmtree(w + "/swap", ignore_errors=True)
    place(target, w + "/swap")
    place("../../../../../.." + target, w + "/swap")
    place(target_dir, w + "/swapdir")
    place(w + "/swapdir-real", w + "/swapdir")
    n += 1
print(n)
`
