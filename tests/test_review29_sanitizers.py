"""Review round 29: the C code that parses untrusted artifact bytes, under AddressSanitizer and
UndefinedBehaviorSanitizer.

The runtime extension (``kernelpack.runtime._launch``) holds three parsers of attacker-made
bytes: ``_zstd_inflate.c`` (the zstd decoder; an unsigned file carries its own digests, so any
frame reaches it), ``_verify.c`` (the verifier's walk) and ``_fbread.c`` (the summary reader and
the module index). The other tests fuzz them in the plain build, where a small heap over-read
or a shift past the width does not crash. Here the extension is compiled again with
``-fsanitize=address,undefined`` into a copy of the package in a temporary directory (the
source tree and its ``_launch.abi3.so`` are not touched), and a subprocess runs, with
``libasan`` preloaded and ``PYTHONMALLOC=malloc`` (pymalloc would pack small objects into
arenas ASan cannot see into), a fixed-seed mutation fuzz of:

1. the built-in zstd decoder, on frames that ``zstandard`` made (levels -7..22, sizes up to
   135 KB, six kinds of data, checksum and content-size flags, small windows, every
   strategy, long-distance matching) mutated, truncated, spliced and with block headers
   rewritten, with ``raw_size`` exact, too small and too large; every input lies at the very
   end of its own malloc block (a read one byte past it is in the redzone), and whatever it
   decodes must be what zstandard decodes;
2. ``kp.load``, program summaries, planning, ``Pack.compiled``, image reads, ``Pack.verify``
   and the ``inspect`` and ``verify`` commands on mutated artifacts: the whole file, the body
   with its digest recomputed (so the mutation reaches the body's verifier, the summary
   reader and, for the 10-module seed, the C module index), and an image's stored bytes with
   its digests and ``raw_size`` rewritten to match (so the mutation reaches the decoder);
3. ``fb_tree``, ``module_index`` and ``verify_fast`` called directly on mutated bodies, at
   real and hostile positions, with the loader's specs and a spec of every schema table;
   the C walker must never accept what the Python walker rejects, and on a body both accept
   ``fb_tree`` must read what ``Table.tree``'s Python path reads;

plus a coverage-guided fuzz of ``_zstd_inflate.c`` alone (a small C harness, gcc's
``-fsanitize-coverage=trace-pc`` as its feedback, exactly-sized input and output buffers,
libzstd as the reference where ``libzstd.so.1`` is present). A sanitizer report, a crash, an
exception that is not the documented one, or a disagreement fails the test.

Two tests show the harness can fail: a throwaway extension with a one-byte heap over-read and
an out-of-range shift is caught through the same detection, and the extension rebuilt with an
off-by-one planted in a copy of ``_zstd_inflate.c`` is caught by the zstd fuzz itself.

Environment (tests only):

    KERNELPACK_TEST_SANITIZER_FUZZ=N   multiply every iteration count by N (default 1: the
                                       file takes ~30 s on an idle 2-core machine, ~90 s on
                                       a busy one; N=20 fuzzes for about 6 minutes)
    KERNELPACK_TEST_SANITIZER_SEED=S   another fixed seed (default 29)

The driver is this file: ``python tests/test_review29_sanitizers.py zstd=N,load=N,fbread=N SEED
OUTDIR`` under the environment :func:`_env` sets (PYTHONPATH: the sanitized copy); it keeps
the input being run in ``OUTDIR/current.bin`` (and what it is in ``current.txt``) for a
reproducer.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
SRC = HERE.parent / "src" / "kernelpack"
SCALE = max(1, int(os.environ.get("KERNELPACK_TEST_SANITIZER_FUZZ", "1") or 1))
SEED = int(os.environ.get("KERNELPACK_TEST_SANITIZER_SEED", "29") or 29)
SOURCES = ("runtime/_launch.c", "runtime/_fastcall.c", "runtime/_fastcall_spec.c",
           "runtime/_callbase.c", "runtime/_drvcall.c", "_verify.c", "_fbread.c", "_zstd.c",
           "_zstd_inflate.c", "_fdowner.c")
SAN = ["-fsanitize=address,undefined", "-fno-sanitize-recover=undefined",
       "-fno-omit-frame-pointer", "-g", "-O1", "-w"]
SLOW_CASE_S = 5.0  # one case (a small input) taking longer is a finding
HANG_S = 120  # one case taking longer: faulthandler dumps the stacks and ends the driver
# what a sanitizer, the interpreter or the driver prints when something is wrong
ALARMS = re.compile(r"ERROR: AddressSanitizer|runtime error:|Sanitizer:DEADLYSIGNAL|"
                    r"Fatal Python error|^Timeout \(|^FINDING|^zfuzz: (DIFF|HANG)",
                    re.MULTILINE)

# ---------------------------------------------------------------- building, running, detecting


def _toolchain() -> tuple[str, str, str] | str:
    """(gcc, libasan.so, Python's include dir), or why the tests cannot run here."""
    if sys.platform != "linux" or sys.version_info < (3, 11):
        return "needs Linux and Python >= 3.11 (the extension is not built on 3.10)"
    gcc = shutil.which("gcc")
    if gcc is None:
        return "no gcc on PATH"
    found = subprocess.run([gcc, "-print-file-name=libasan.so"], capture_output=True,
                           text=True, check=False).stdout.strip()
    if not os.path.isabs(found) or not os.path.exists(found):
        return f"gcc has no libasan.so (-print-file-name answers {found!r})"
    include = sysconfig.get_paths()["include"]
    if not os.path.exists(os.path.join(include, "Python.h")):
        return f"no Python.h in {include}"
    return gcc, os.path.realpath(found), include


def _limited_api() -> str:
    return "0x030C0000" if sys.version_info >= (3, 12) else "0x030B0000"  # as setup.py


def _compile(gcc: str, include: str, sources: list[Path], out: Path, *extra: str) -> None:
    cmd = [gcc, "-shared", "-fPIC", *SAN, f"-I{include}", f"-I{SRC}", f"-I{SRC / 'runtime'}",
           f"-DPy_LIMITED_API={_limited_api()}", *extra, *map(str, sources), "-ldl", "-o",
           str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    assert proc.returncode == 0, f"{' '.join(cmd)}\n{proc.stderr[-3000:]}"


def _sanitized_package(root: Path, gcc: str, include: str, patch: tuple[str, str] | None = None
                       ) -> Path:
    """A copy of the package under ``root`` with the extension built sanitized; ``patch``:
    (old, new) text replaced once in the copy of _zstd_inflate.c first."""
    pkg = root / "pkg"
    shutil.copytree(SRC, pkg / "kernelpack",
                    ignore=shutil.ignore_patterns("__pycache__", "*.so", "*.pyd"))
    copy = pkg / "kernelpack"
    if patch is not None:
        path = copy / "_zstd_inflate.c"
        text = path.read_text()
        assert text.count(patch[0]) == 1, patch[0]
        path.write_text(text.replace(patch[0], patch[1]))
    _compile(gcc, include, [copy / s for s in SOURCES],
             copy / "runtime" / "_launch.abi3.so")
    return pkg


def _env(asan: str, pythonpath: Path | None) -> dict[str, str]:
    env = dict(os.environ)
    env.update(LD_PRELOAD=asan, PYTHONMALLOC="malloc", PYTHONDONTWRITEBYTECODE="1",
               # leaks: CPython keeps memory to exit on purpose; no core dumps
               ASAN_OPTIONS="detect_leaks=0:abort_on_error=0:halt_on_error=1:disable_coredump=1",
               UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1")
    if pythonpath is not None:
        env["PYTHONPATH"] = str(pythonpath)
        env["KP_SANITIZED_PACKAGE"] = str(pythonpath)
    return env


def problems(proc: subprocess.CompletedProcess) -> list[str]:
    """What went wrong in a sanitized run: the alarm lines of its output, and its status."""
    out = proc.stdout + proc.stderr
    found = [line.strip() for line in out.splitlines() if ALARMS.search(line)]
    if proc.returncode != 0:
        found.append(f"exit status {proc.returncode}")
    return found


def _report(proc: subprocess.CompletedProcess) -> str:
    return f"status {proc.returncode}\n--- stdout\n{proc.stdout[-6000:]}\n--- stderr\n" \
           f"{proc.stderr[-12000:]}"


# ---------------------------------------------------------------- the C harness of _zstd_inflate.c

ZFUZZ_C = r"""
#include <dirent.h>
#include <dlfcn.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "_zstd_inflate.h"
#define MAP (1 << 16)
static uint8_t cov[MAP], seen[MAP];
static uintptr_t prev;
void __sanitizer_cov_trace_pc(void) {
    uintptr_t pc = (uintptr_t)__builtin_return_address(0), h = (pc ^ (pc >> 12)) & (MAP - 1);
    cov[(h ^ prev) & (MAP - 1)]++;
    prev = h >> 1;
}
typedef struct { uint8_t *d; size_t n; } In;
static In *corp; static size_t ncorp, capc;
static const uint8_t *cur; static size_t curn, curcap; static const char *outdir;
static uint64_t rs;
static uint64_t rnd(void) { rs ^= rs << 13; rs ^= rs >> 7; rs ^= rs << 17; return rs; }
static size_t below(size_t n) { return n ? (size_t)(rnd() % n) : 0; }
static void dump(const char *why) {
    char p[4096]; snprintf(p, sizeof p, "%s/zfuzz-input.bin", outdir);
    FILE *f = fopen(p, "wb"); if (f) { fwrite(cur, 1, curn, f); fclose(f); }
    fprintf(stderr, "zfuzz: %s: input of %zu bytes, cap %zu, in %s\n", why, curn, curcap, p);
}
static void on_death(void) { dump("sanitizer report"); }
static void on_alarm(int s) { (void)s; dump("HANG over 10 s"); _exit(70); }
extern void __sanitizer_set_death_callback(void (*)(void));
static void add(const uint8_t *d, size_t n) {
    if (ncorp == capc) { capc = capc ? 2 * capc : 256; corp = realloc(corp, capc * sizeof *corp); }
    corp[ncorp].d = malloc(n ? n : 1); memcpy(corp[ncorp].d, d, n); corp[ncorp++].n = n;
}
typedef size_t (*dec_fn)(void *, size_t, const void *, size_t);
typedef size_t (*fsz_fn)(const void *, size_t);
typedef unsigned (*err_fn)(size_t);
static dec_fn zdec; static fsz_fn zfsz; static err_fn zerr;
static uint64_t execs, oks, diffs;
static size_t mutate(uint8_t *g, size_t n, size_t maxn) {
    static const uint8_t v8[] = {0, 1, 2, 3, 4, 7, 8, 15, 16, 31, 32, 63, 64, 127, 128, 129, 192, 254, 255};
    int rounds = 1 + (int)below(rnd() & 1 ? 2 : 8);
    for (int r = 0; r < rounds; r++) {
        unsigned op = n ? (unsigned)below(11) : 6;
        size_t at = below(n), k;
        switch (op) {
        case 0: case 1: g[at] ^= (uint8_t)(1u << below(8)); break;
        case 2: g[at] = (uint8_t)rnd(); break;
        case 3: g[at] = v8[below(sizeof v8)]; break;
        case 4: g[at] = (uint8_t)(g[at] + (below(2) ? 1 : -1) * (int)(1 + below(8))); break;
        case 5: n = below(n + 1); break;
        case 6: k = 1 + below(4); if (n + k > maxn) break; at = below(n + 1);
                memmove(g + at + k, g + at, n - at); for (size_t i = 0; i < k; i++) g[at + i] = (uint8_t)rnd();
                n += k; break;
        case 7: if (n < 2) break; k = 1 + below(n - at < 8 ? n - at : 8); memmove(g + at, g + at + k, n - at - k);
                n -= k; break;
        case 8: { In *o = &corp[below(ncorp)]; k = 1 + below(32);
                  if (at < o->n) { if (at + k > o->n) k = o->n - at; if (at + k > n) k = n - at; memcpy(g + at, o->d + at, k); }
                  break; }
        case 9: { size_t b = below(n); k = 1 + below(16); if (at + k > n) k = n - at; if (b + k > n) k = n - b;
                  memmove(g + b, g + at, k); break; }
        default: { if (n < 3) break; at = below(n - 2); uint32_t v = g[at] | g[at + 1] << 8 | (uint32_t)g[at + 2] << 16;
                   v += (uint32_t)((int)below(64) - 32) << (below(2) ? 0 : 3);
                   g[at] = (uint8_t)v; g[at + 1] = (uint8_t)(v >> 8); g[at + 2] = (uint8_t)(v >> 16); break; }
        }
    }
    return n;
}
static void run(const uint8_t *in, size_t n, uint64_t r) {
    uint8_t *src = malloc(n ? n : 1); memcpy(src, in, n); cur = src; curn = n;
    char err[KP_ZSTD_ERROR_SIZE]; uint64_t declared = 0; size_t fsz = 0, got = 0, cap;
    int crc = kp_zstd_content_size(src, n, &declared, err);
    (void)kp_zstd_frame_size(src, n, &fsz, err);
    size_t base = crc == KP_ZSTD_OK && declared < (1u << 22) ? (size_t)declared : 4096;
    switch (r % 8) {
    case 0: case 1: cap = base; break;
    case 2: cap = base ? base - 1 : 0; break;
    case 3: cap = base + 1; break;
    case 4: cap = 0; break;
    case 5: cap = base / 2; break;
    case 6: cap = (size_t)(r >> 8) % (base + 300); break;
    default: cap = base + 4096 + (size_t)((r >> 8) % 200000);
    }
    curcap = cap;
    /* as _zstd.c: the buffer is the declared size when that is below cap */
    size_t alloc = ((r >> 40) & 1) && crc == KP_ZSTD_OK && declared < cap ? (size_t)declared : cap;
    uint8_t *dst = malloc(alloc ? alloc : 1);
    alarm(10);
    int rc = kp_zstd_decompress(src, n, dst, cap, &got, err);
    alarm(0);
    execs++;
    if (rc == KP_ZSTD_OK) {
        oks++;
        if (got > alloc) { dump("DIFF: more bytes than the buffer holds"); diffs++; }
        else if (zdec) {
            size_t zf = zfsz(src, n); uint8_t *ref = malloc(cap ? cap : 1);
            size_t zr = zerr(zf) ? zf : zdec(ref, cap, src, zf);
            if (zerr(zr) || zr != got || memcmp(ref, dst, got) != 0) {
                if (++diffs <= 3) dump("DIFF: libzstd does not decode this to the same bytes");
            }
            free(ref);
        }
    }
    free(dst); free(src);
}
static int novel(void) {
    int fresh = 0;
    for (size_t i = 0; i < MAP; i++) if (cov[i]) {
        uint8_t c = cov[i], b = c >= 128 ? 128 : c >= 32 ? 64 : c >= 16 ? 32 : c >= 8 ? 16 : c >= 4 ? 8 : c >= 3 ? 4 : c >= 2 ? 2 : 1;
        if (!(seen[i] & b)) { seen[i] |= b; fresh = 1; }
    }
    memset(cov, 0, MAP); prev = 0;
    return fresh;
}
int main(int argc, char **argv) {
    if (argc != 5) { fprintf(stderr, "usage: zfuzz SEEDS OUTDIR EXECS SEED\n"); return 2; }
    outdir = argv[2];
    uint64_t budget = strtoull(argv[3], NULL, 10);
    rs = strtoull(argv[4], NULL, 10) * 2654435761u + 88172645463325252ull;
    __sanitizer_set_death_callback(on_death); signal(SIGALRM, on_alarm);
    void *lib = dlopen("libzstd.so.1", RTLD_NOW);
    if (lib) { zdec = (dec_fn)dlsym(lib, "ZSTD_decompress"); zfsz = (fsz_fn)dlsym(lib, "ZSTD_findFrameCompressedSize");
               zerr = (err_fn)dlsym(lib, "ZSTD_isError"); if (!zdec || !zfsz || !zerr) zdec = NULL; }
    static uint8_t buf[1 << 21], g[1 << 21];
    for (int i = 0;; i++) {  /* seeds are named 0000.zst, 0001.zst, ...: a fixed order */
        char p[4096]; snprintf(p, sizeof p, "%s/%04d.zst", argv[1], i);
        FILE *f = fopen(p, "rb"); if (!f) break;
        size_t n = fread(buf, 1, sizeof buf, f); fclose(f); add(buf, n);
    }
    size_t nseeds = ncorp;
    for (size_t i = 0; i < nseeds; i++) { for (uint64_t k = 0; k < 8; k++) run(corp[i].d, corp[i].n, k | (rnd() & ~7ull)); novel(); }
    while (execs < budget && nseeds) {
        size_t pick = below(4) == 0 && ncorp > nseeds ? nseeds + below(ncorp - nseeds) : below(ncorp);
        size_t n = corp[pick].n; memcpy(g, corp[pick].d, n);
        n = mutate(g, n, sizeof g);
        run(g, n, rnd());
        if (novel() && ncorp < 100000) add(g, n);
    }
    int edges = 0; for (size_t i = 0; i < MAP; i++) edges += seen[i] != 0;
    printf("zfuzz: %llu execs, %zu seeds, corpus %zu, %d edges, %llu decoded, libzstd %s, %llu differences\n",
           (unsigned long long)execs, nseeds, ncorp, edges, (unsigned long long)oks, zdec ? "compared" : "absent",
           (unsigned long long)diffs);
    return diffs ? 3 : 0;
}
"""

# ---------------------------------------------------------------- the fuzz driver (subprocess)


class Fuzz:
    """The three Python-level targets; run in the sanitized subprocess (``main``)."""

    PRIVATE = bytes(range(32))  # signs one seed (ed25519 seed bytes)

    def __init__(self, outdir: str) -> None:
        sys.path.insert(0, str(HERE))  # kp_samples, kp_handwritten, test_zstd_inflate
        import zstandard

        import kernelpack
        from kernelpack.runtime import _launch

        want = os.environ.get("KP_SANITIZED_PACKAGE")
        assert want is None or _launch.__file__.startswith(want), _launch.__file__
        assert kernelpack.__file__.startswith(want or ""), kernelpack.__file__
        self.z = zstandard
        self.ext = _launch
        self.reference = zstandard.ZstdDecompressor(max_window_size=1 << 31)
        self.outdir = outdir
        from kernelpack.signing import load_private_key, public_key_bytes

        self.public = public_key_bytes(load_private_key(self.PRIVATE))
        self.findings: list[str] = []
        self.last: tuple[float, bytes, str] | None = None
        self.cur = os.open(os.path.join(outdir, "current.bin"),
                           os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)

    # -- bookkeeping
    def keep(self, data: bytes, what: str) -> None:
        """Called before each case: the input is kept for a reproducer, and the previous case
        is a finding if it was slow."""
        import faulthandler
        import time

        now = time.perf_counter()
        if self.last is not None and now - self.last[0] > SLOW_CASE_S:
            self.finding("slow", self.last[1], f"{self.last[2]}: {now - self.last[0]:.1f} s")
        self.last = (now, data, what)
        faulthandler.dump_traceback_later(HANG_S, exit=True)
        os.ftruncate(self.cur, 0)
        os.pwrite(self.cur, data, 0)
        with open(os.path.join(self.outdir, "current.txt"), "w") as f:
            f.write(what)

    def finding(self, kind: str, data: bytes, detail: str) -> None:
        path = os.path.join(self.outdir, f"finding-{len(self.findings):03d}-{kind}.bin")
        with open(path, "wb") as f:
            f.write(data)
        self.findings.append(f"{kind}: {detail} (input {path})")
        print(f"FINDING {kind}: {detail} (input {path})", flush=True)

    @staticmethod
    def exact(data: bytes) -> memoryview:
        """``data`` at the very end of its own malloc block: a read past it hits the redzone
        (a bytes object keeps a NUL after its data)."""
        import ctypes

        m = max(len(data), 64)  # ctypes keeps arrays up to 16 bytes inside the object
        arr = (ctypes.c_ubyte * m)()
        ctypes.memmove(ctypes.addressof(arr) + m - len(data), data, len(data))
        return memoryview(arr).cast("B")[m - len(data):]

    # -- mutations
    @staticmethod
    def mutate(data: bytes, rng, others: list[bytes], aligned: bool = False) -> bytes:
        import struct

        g = bytearray(data)
        for _ in range(rng.choice((1, 1, 1, 2, 3, 5, 8))):
            if not g:
                g += bytes(rng.randrange(256) for _ in range(rng.randint(1, 8)))
                continue
            op, at = rng.randrange(14), rng.randrange(len(g))
            if op < 3:
                g[at] ^= 1 << rng.randrange(8)
            elif op == 3:
                g[at] = rng.choice((0, 1, 2, 3, 4, 7, 8, 15, 16, 31, 32, 63, 64, 127, 128, 255))
            elif op == 4 and len(g) >= 4:  # offsets and counts
                at = min(at & ~3 if aligned or rng.random() < 0.5 else at, len(g) - 4)
                v = rng.choice((0, 1, 4, 0xFFFF, 0x10000, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFF,
                                0xFFFFFFFC)) if rng.random() < 0.6 else \
                    (struct.unpack_from("<I", g, at)[0] + rng.randint(-16, 16)) & 0xFFFFFFFF
                struct.pack_into("<I", g, at, v)
            elif op == 5 and len(g) >= 2:  # vtable entries
                at = min(at & ~1, len(g) - 2)
                v = struct.unpack_from("<H", g, at)[0] + rng.choice((-8, -4, -2, 2, 4, 8, 0x8000))
                struct.pack_into("<H", g, at, v & 0xFFFF)
            elif op == 6:
                del g[rng.randrange(len(g) + 1):]
            elif op == 7:
                g[at:at] = bytes(rng.randrange(256) for _ in range(rng.choice((1, 2, 4, 8))))
            elif op == 8:
                del g[at:at + rng.randint(1, 8)]
            elif op == 9 and others:
                o, k = rng.choice(others), rng.randint(1, 64)
                if at < len(o):
                    g[at:at + k] = o[at:at + k]
            elif op == 10:
                b, k = rng.randrange(len(g)), rng.randint(1, 16)
                g[b:b + k] = g[at:at + k]
            elif op == 11 and len(g) >= 8:  # an offset pointing at another 4-aligned place
                at = min(at & ~3, len(g) - 4)
                struct.pack_into("<I", g, at, rng.randrange(0, len(g) - at + 8) & ~3)
            elif op == 12:  # over a string's bytes: a multi-byte character, maybe broken
                c = rng.choice(("é", "€", "😀", "\u0800", "\U0010FFFF")).encode()
                c = rng.choice((c, c, c[:-1], c[1:], b"\xc0\x80", b"\xed\xa0\x80",
                                b"\xf4\x90\x80\x80", b"\xe0\x80\xaf", b"\xf0\x8f\xbf\xbf"))
                g[at:at + len(c)] = c[:len(g) - at]
            else:
                g[at] = rng.randrange(256)
        return bytes(g)

    # -- 1. zstd
    def zstd_corpus(self, rng) -> list[tuple[bytes, int]]:
        import random

        from test_zstd_inflate import KINDS

        z, out = self.z, []
        for kind in ("text", "cubin-like", "random", "zeros", "mixed", "one-byte"):
            for n in (0, 1, 5, 40, 300, 2000, 9000, 40000, 135000):
                data = KINDS[kind](n, random.Random(f"{kind}{n}"))
                for level in (-7, -1, 1, 3, 9, 19, 22):
                    if rng.random() < 0.55:
                        continue
                    ck, cs = rng.random() < 0.6, rng.random() < 0.8
                    out.append((z.ZstdCompressor(level=level, write_checksum=ck,
                                                 write_content_size=cs).compress(data), n))
        for wl in (10, 11, 14):
            for strat in (1, 2, 4, 6, 8, 9):
                data = KINDS["mixed"](20000, random.Random(wl * strat))
                p = z.ZstdCompressionParameters(
                    window_log=wl, chain_log=wl, hash_log=wl, search_log=3,
                    min_match=3 + strat % 3, target_length=8 << (strat % 3), strategy=strat,
                    write_checksum=strat % 2, write_content_size=1 - strat % 2,
                    enable_ldm=strat == 9)
                out.append((z.ZstdCompressor(compression_params=p).compress(data), len(data)))
        return out

    def blocks(self, frame: bytes) -> list[tuple[int, int]]:
        try:
            pos = self.z.frame_header_size(frame)
        except self.z.ZstdError:
            return []
        out = []
        while pos + 3 <= len(frame):
            bh = int.from_bytes(frame[pos:pos + 3], "little")
            size = 3 + (1 if (bh >> 1) & 3 == 1 else bh >> 3)
            out.append((pos, size))
            pos += size
            if bh & 1:
                break
        return out

    def zstd_mutate(self, frame: bytes, rng, corpus: list[tuple[bytes, int]]) -> bytes:
        r, blocks = rng.random(), self.blocks(frame)
        if r < 0.55 or not blocks:
            return self.mutate(frame, rng, [f for f, _ in corpus[::7]])
        g = bytearray(frame)
        start, size = rng.choice(blocks)
        if r < 0.75:  # inside one block, near its start: literals and sequences headers
            hi = min(start + min(size, 3 + rng.choice((4, 16, 64, size))), len(g))
            for _ in range(rng.randint(1, 3) if hi > start else 0):
                at = rng.randrange(start, hi)
                g[at] = rng.randrange(256) if rng.random() < 0.5 else g[at] ^ (1 << rng.randrange(8))
            return bytes(g)
        if r < 0.9:  # this frame's header and first blocks, another frame's later blocks
            other = rng.choice(corpus)[0]
            theirs = self.blocks(other)
            return frame[:start] + (other[rng.choice(theirs)[0]:] if theirs else other)
        bh = int.from_bytes(g[start:start + 3], "little")  # a block header: type, last, size
        bh = rng.choice((bh ^ rng.choice((2, 4, 6)), bh ^ 1, (bh & 7) | (
            (max(0, (bh >> 3) + rng.randint(-9, 9)) & 0x1FFFFF) << 3)))
        g[start:start + 3] = bh.to_bytes(3, "little")
        return bytes(g)

    def run_zstd(self, iters: int, seed: int) -> dict:
        import random

        from kernelpack import _zstd

        builtin = _zstd._open_builtin()
        assert builtin is not None
        rng = random.Random(seed)
        corpus = self.zstd_corpus(random.Random(seed ^ 0x5A))
        counts: dict[str, int] = {}
        for _ in range(iters):
            frame, n = rng.choice(corpus)
            if rng.random() > 0.04:
                frame = self.zstd_mutate(frame, rng, corpus)
            self.keep(frame, "zstd, content size")
            try:
                declared = builtin.frame_content_size(self.exact(frame))
            except _zstd.ZstdFormatError:
                declared = -1
            base = declared if 0 <= declared <= 1 << 22 else n
            raw_size = rng.choice((base, base, base, max(base - 1, 0), base + 1, 0, base // 2,
                                   base + rng.randrange(1, 70000), rng.randrange(base + 300)))
            self.keep(frame, f"zstd, raw_size {raw_size}")
            try:
                self.ext.zstd_builtin_frame_size(self.exact(frame))
            except ValueError:
                pass
            try:
                got = ("ok", builtin.decompress(self.exact(frame), raw_size))
            except _zstd.ZstdFormatError as exc:
                got = ("error", str(exc))
            except Exception as exc:  # noqa: BLE001 - the finding
                self.finding("zstd-exception", frame, f"raw_size {raw_size}: {exc!r}")
                continue
            want = self.zstd_reference(frame, raw_size)
            if want is None:
                continue
            key = f"{got[0]}/{want[0]}"
            counts[key] = counts.get(key, 0) + 1
            if got[0] == "ok" and len(got[1]) > raw_size:
                self.finding("zstd-too-long", frame, f"{len(got[1])} bytes, raw_size {raw_size}")
            elif got[0] == "ok" and (want[0] == "error" or got[1] != want[1][:raw_size]):
                self.finding("zstd-differs", frame, f"raw_size {raw_size}: the built-in decoder "
                             f"gives {len(got[1])} bytes, zstandard {want[0]}")
        return counts

    def zstd_reference(self, frame: bytes, raw_size: int) -> tuple[str, object] | None:
        z = self.z
        try:
            declared = z.frame_content_size(frame)
            if declared > 4 * raw_size + 4096:
                return None  # zstandard would allocate a hostile header's size
            return "ok", self.reference.decompress(frame, max_output_size=max(raw_size, 1))
        except z.ZstdError as exc:
            return "error", str(exc)

    # -- 2. artifacts
    def artifact_seeds(self) -> list[bytes]:
        import hashlib

        import kp_handwritten
        import kp_samples

        import kernelpack as kp

        seeds = [kp.save(kp_samples.tiny()), kp.save(kp_samples.axpy()),
                 kp.save(kp_samples.rich()),
                 kp.save([kp_samples.axpy(name=f"p{i}", module=f"m{i}") for i in range(10)]),
                 kp.save(kp_samples.rich(), sign_with=self.PRIVATE)]
        for path in (HERE / "golden" / "format-1.0.kpack", HERE.parent / "example.kpack"):
            if path.exists():
                seeds.append(path.read_bytes())
        raw = b"\x7fELF" + bytes((i * 7 + i // 13) % 251 for i in range(3000))
        seeds.append(kp_handwritten.artifact(
            image=self.z.ZstdCompressor(level=9).compress(raw), codec=1, raw_size=len(raw),
            raw_digest=hashlib.sha256(raw).digest()))
        return seeds

    @staticmethod
    def parse(data: bytes) -> tuple[bytes, list[bytes], list[tuple], tuple[bytes, bytes] | None]:
        """A valid artifact's body, blobs, per image (blob, digest at, raw digest at, raw_size
        at, codec), and its signature (key, signature) or None."""
        from kernelpack._fbread import Table

        pack = Table.root(memoryview(data), "Pack")
        body = bytes(pack.view("body"))
        sig = pack.get("signature")
        sig = None if sig is None else (bytes(sig.get("public_key")), bytes(sig.get("signature")))
        views = pack.byte_views("blobs")
        images = []
        modules = Table.root(body, "Body").tables("modules")
        for m in range(len(modules)):
            tables = modules[m].tables("images")
            for j in range(len(tables)):
                t = tables[j]
                images.append((t.get("blob"), t.target("digest") + 4, t.target("raw_digest") + 4,
                               t.position("raw_size"), t.get("codec")))
        return body, [bytes(views[i]) for i in range(len(views))], images, sig

    def with_image(self, parsed, rng, zcorpus) -> bytes:
        """A blob mutated (or replaced by a mutated frame), every image naming it given
        matching digests and raw_size, the body digest recomputed: the mutation reaches the
        decoder past every check before it."""
        import hashlib
        import struct

        from kernelpack import serializer

        body, blobs, images, sig = parsed
        blob = rng.choice([im for im in images if im[4] == 1] or images)[0]
        old = rng.choice(zcorpus)[0] if rng.random() < 0.3 else blobs[blob]
        new = self.zstd_mutate(old, rng, zcorpus) if rng.random() < 0.9 else old
        try:
            declared = self.z.frame_content_size(new)
            raw = self.reference.decompress(new, max_output_size=max(declared, 1)) \
                if 0 <= declared <= 1 << 22 else None
        except self.z.ZstdError:
            declared, raw = -1, None
        body, blobs = bytearray(body), list(blobs)
        blobs[blob] = new
        for b, at, raw_at, size_at, _ in images:
            if b == blob:
                body[at:at + 32] = hashlib.sha256(new).digest()
                if raw is not None:
                    body[raw_at:raw_at + 32] = hashlib.sha256(raw).digest()
                if size_at and declared >= 0 and rng.random() < 0.9:
                    struct.pack_into("<Q", body, size_at, declared)
        return serializer.assemble(bytes(body), blobs, sig)

    def exercise(self, data: bytes, cli_path: str | None, counts: dict) -> None:
        """What a reader does with a file; raises only what is not a KernelPackError."""
        import contextlib
        import io

        import kernelpack as kp
        from kernelpack.errors import KernelPackError

        try:
            kp.load(data, trusted_keys=[self.public])
        except KernelPackError:
            pass
        try:
            pack = kp.load(data)
        except KernelPackError:
            return
        counts["loaded"] = counts.get("loaded", 0) + 1
        repr(pack)
        for name in pack.programs[:6]:
            try:
                program = pack[name]
                summary = program.summary
                repr(summary)
                _ = program.modules  # decodes the summary's module references
                shapes = [tuple(3 for _ in p.shape) for p in summary.inputs
                          if isinstance(p, kp.Tensor)]
                try:
                    program.planner.plan_shapes(
                        shapes, [3 for p in summary.inputs if isinstance(p, kp.Scalar)])
                except TypeError:
                    pass  # a float scalar given an int: the caller's mistake, not the file's
                pack.compiled(name)
            except KernelPackError:
                pass
        for module in list(pack.modules.values())[:12]:
            for image in module.images:
                repr(image)
                try:
                    image.read(keep=False)
                    counts["image-ok"] = counts.get("image-ok", 0) + 1
                except KernelPackError as exc:
                    key = "image-zstd-refused" if "decompression failed" in str(exc) else \
                        "image-other-error"
                    counts[key] = counts.get(key, 0) + 1
        try:
            pack.verify()
            verified = True
        except KernelPackError:
            verified = False
        if cli_path is not None:
            from kernelpack import cli

            Path(cli_path).write_bytes(data)
            for cmd in (["inspect", cli_path], ["verify", cli_path]):
                err = io.StringIO()
                with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
                    status = cli.main(cmd)
                # the command catches ValueError and OSError too: on a file that verifies,
                # any failure of it is the command's own
                if verified and status != 0:
                    raise AssertionError(f"kernelpack {cmd[0]} answers {status} on a file that "
                                         f"verifies: {err.getvalue()[-500:]}")

    def run_load(self, iters: int, seed: int) -> dict:
        import random

        from kernelpack import serializer

        rng = random.Random(seed)
        seeds = self.artifact_seeds()
        parsed = [self.parse(s) for s in seeds]
        bodies = [p[0] for p in parsed]
        zcorpus = self.zstd_corpus(random.Random(seed ^ 0x77))[::3]
        cli_path = os.path.join(self.outdir, "fuzz.kpack")
        counts: dict[str, int] = {}
        for i in range(iters):
            k = rng.randrange(len(seeds))
            mode = rng.choice(("file", "body", "body", "image", "image"))
            if mode == "file":
                data = self.mutate(seeds[k], rng, seeds)
            elif mode == "body":
                data = serializer.assemble(self.mutate(bodies[k], rng, bodies,
                                                       aligned=rng.random() < 0.5),
                                           parsed[k][1], parsed[k][3])
            else:
                data = self.with_image(parsed[k], rng, zcorpus)
            counts[mode] = counts.get(mode, 0) + 1
            self.keep(data, f"artifact ({mode} mutated)")
            try:
                self.exercise(data, cli_path if i % 8 == 0 else None, counts)
            except Exception as exc:  # noqa: BLE001 - the finding
                import traceback

                self.finding("artifact-exception", data,
                             f"{exc!r}\n{traceback.format_exc(limit=-4)}")
        return counts

    # -- 3. _fbread and _verify directly
    def run_fbread(self, iters: int, seed: int) -> dict:
        import random
        import struct

        from kernelpack import _decode, _verify_native, loader, verify
        from kernelpack._fbread import _SLOTS, Table, _tree, tree_spec
        from kernelpack._schema import TABLES
        from kernelpack.errors import KernelPackError

        def fields(table: str, depth: int) -> tuple:
            return tuple((name, fields(_SLOTS[table][name][2], depth + 1))
                         if _SLOTS[table][name][1] in ("t", "vt") else name
                         for name, _, _ in TABLES[table]
                         if depth < 4 or _SLOTS[table][name][1] not in ("t", "vt"))

        def positions(body: bytes) -> list[tuple[str, int]]:
            out: list[tuple[str, int]] = []

            def walk(t: Table) -> None:
                out.append((t.name, t.pos))
                for name, _, _ in TABLES[t.name]:
                    cat, sub = _SLOTS[t.name][name][1], _SLOTS[t.name][name][2]
                    if cat == "t" and t.has(name):
                        walk(Table(t.buf, t.target(name), sub))
                    elif cat == "vt":
                        tables = t.tables(name)
                        for i in range(len(tables)):
                            walk(tables[i])

            walk(Table.root(body, "Body"))
            return out

        rng = random.Random(seed)
        bodies = [self.parse(s)[0] for s in self.artifact_seeds()]
        where = [positions(b) for b in bodies]
        modules = [Table.root(b, "Body").tables("modules") for b in bodies]
        specs = {name: tree_spec(name, fields(name, 0)) for name in TABLES}
        loader_specs = [("Module", loader._MODULE), ("Body", loader._PROGRAM_NAMES),
                        ("Program", _decode._HEAD), ("Variant", _decode._VARIANT),
                        ("Launch", _decode._LAUNCH_TREE)]
        fast = _verify_native.load()
        _, index, described = _verify_native.tables(verify._PLANS)
        counts: dict[str, int] = {}

        def count(key: str) -> None:
            counts[key] = counts.get(key, 0) + 1

        for _ in range(iters):
            k = rng.randrange(len(bodies))
            buf = self.mutate(bodies[k], rng, bodies, aligned=rng.random() < 0.5) \
                if rng.random() < 0.9 else bodies[k]
            self.keep(buf, "a Body buffer for fb_tree / module_index / verify_fast")
            name, pos = rng.choice(where[k])
            if rng.random() < 0.2:
                pos = rng.choice((0, len(buf), len(buf) - 1, len(buf) + 4,
                                  rng.randrange(len(buf) + 8), (1 << 64) - 4, 1 << 40))
            if rng.random() < 0.2:
                name, spec = rng.choice(loader_specs)
            else:
                spec = specs[name if rng.random() < 0.8 else rng.choice(list(specs))]
            form = rng.choice((bytes, bytearray, self.exact, self.exact))(buf)
            try:
                self.ext.fb_tree(form, pos, spec)
                count("fb_tree-read")
            except (ValueError, TypeError):  # documented: a read outside, a bad UTF-8 string
                count("fb_tree-refused")
            except Exception as exc:  # noqa: BLE001 - the finding
                self.finding("fb_tree-exception", buf, f"at {pos}, {name} spec: {exc!r}")
            start, n = modules[k].start, len(modules[k])
            if rng.random() < 0.2:
                start = rng.randrange(len(buf) + 8)
                n = rng.choice((0, 1, 2, n, n + 1, 1000))
            try:
                names = self.ext.module_index(form, start, n, loader._MODULE,
                                              loader._INDEX_LIMITS + (rng.choice((0, 1, 30)),))
                count("module_index-" + ("none" if names is None else "names"))
            except (ValueError, TypeError):
                count("module_index-refused")
            except Exception as exc:  # noqa: BLE001 - the finding
                self.finding("module_index-exception", buf, f"start {start} count {n}: {exc!r}")
            c = fast(self.exact(buf), index["Body"], None, described, verify.MAX_TABLE_DEPTH,
                     verify.MAX_NAME_LENGTH, verify.MAX_FILE_SIZE, verify.BODY_ALIGNMENT)
            try:
                py = verify.verify_buffer(buf, "Body", identifier=None, _use_c=False)
            except KernelPackError:
                py = -1
            if c >= 0 and c != py:
                self.finding("verify-disagrees", buf, f"C walker root {c}, Python walker {py}")
            if py < 0:
                continue
            count("verified")
            table = Table.root(buf, "Body")
            try:
                native = self.ext.fb_tree(buf, table.pos, specs["Body"])
            except ValueError:  # a string that is not UTF-8 is the verifier's to refuse...
                native = None
            try:
                python = _tree(table, specs["Body"])
            except (ValueError, struct.error):
                python = None
            if native != python:
                self.finding("fb_tree-differs", buf, "fb_tree and Table.tree's Python path "
                             "read a verified body differently")
        return counts


def main(argv: list[str]) -> int:
    """``TARGET=CASES[,TARGET=CASES...] SEED OUTDIR``: exit 1 on a finding (a sanitizer report
    ends the process by itself)."""
    import time

    plan, seed, outdir = argv[0], int(argv[1]), argv[2]
    os.makedirs(outdir, exist_ok=True)
    fuzz = Fuzz(outdir)
    for item in plan.split(","):
        name, iters = item.split("=")
        t0 = time.perf_counter()
        counts = getattr(fuzz, f"run_{name}")(int(iters), seed)
        fuzz.keep(b"", "between targets")  # (times the target's last case)
        fuzz.last = None
        print(f"{name}: {iters} cases, seed {seed}, {time.perf_counter() - t0:.1f} s: {counts}",
              flush=True)
    return 1 if fuzz.findings else 0


# ---------------------------------------------------------------- the tests

TOOLS = _toolchain()
pytestmark = pytest.mark.skipif(isinstance(TOOLS, str), reason=str(TOOLS))


def _driver(pkg: Path, plan: dict[str, int], outdir: Path, timeout: float
            ) -> subprocess.CompletedProcess:
    spec = ",".join(f"{name}={cases}" for name, cases in plan.items())
    return subprocess.run([sys.executable, str(Path(__file__).resolve()), spec, str(SEED),
                           str(outdir)], capture_output=True, text=True, check=False,
                          env=_env(TOOLS[1], pkg), timeout=timeout)  # type: ignore[index]


def test_harness_catches_an_over_read_and_undefined_behaviour(tmp_path: Path) -> None:
    """The detection used below, on a throwaway extension: a one-byte heap over-read and a
    shift past the width are reported (and a clean call is not)."""
    gcc, asan, include = TOOLS  # type: ignore[misc]
    source = tmp_path / "oob.c"
    source.write_text(r"""
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdlib.h>
#include <string.h>
static PyObject *read_at(PyObject *self, PyObject *args) {
    Py_ssize_t n, at;
    if (!PyArg_ParseTuple(args, "nn", &n, &at)) return NULL;
    unsigned char *b = malloc(n);
    memset(b, 7, n);
    volatile unsigned char v = b[at];
    free(b);
    return PyLong_FromLong(v);
}
static PyObject *shift(PyObject *self, PyObject *args) {
    int s;
    if (!PyArg_ParseTuple(args, "i", &s)) return NULL;
    volatile int one = 1;
    return PyLong_FromLong(one << s);
}
static PyMethodDef m[] = {{"read_at", read_at, METH_VARARGS, ""},
                          {"shift", shift, METH_VARARGS, ""}, {NULL, NULL, 0, NULL}};
static struct PyModuleDef d = {PyModuleDef_HEAD_INIT, "oob", NULL, -1, m};
PyMODINIT_FUNC PyInit_oob(void) { return PyModule_Create(&d); }
""")
    _compile(gcc, include, [source], tmp_path / "oob.abi3.so")

    def run(code: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-c", f"import oob; print({code})"],
                              capture_output=True, text=True, check=False, cwd=tmp_path,
                              env=_env(asan, None), timeout=60)

    clean = run("oob.read_at(16, 15), oob.shift(30)")
    assert problems(clean) == [], _report(clean)
    over = run("oob.read_at(16, 16)")
    assert any("heap-buffer-overflow" in p for p in problems(over)), _report(over)
    assert "read_at" in over.stderr
    shifted = run("oob.shift(40)")
    assert any("shift exponent 40" in p for p in problems(shifted)), _report(shifted)


def test_zstd_fuzz_catches_a_planted_off_by_one(tmp_path: Path) -> None:
    """The zstd fuzz below, against a copy of _zstd_inflate.c whose backward bit streams
    read their end marker one byte past their end: ASan reports it within a few cases."""
    gcc, _, include = TOOLS  # type: ignore[misc]
    pkg = _sanitized_package(tmp_path / "planted", gcc, include,
                             patch=("last = p[n - 1];", "last = p[n];"))
    proc = _driver(pkg, {"zstd": 300}, tmp_path / "out", timeout=300)
    found = problems(proc)
    assert any("heap-buffer-overflow" in p for p in found), _report(proc)
    assert "bb_init" in proc.stderr, _report(proc)
    assert (tmp_path / "out" / "current.bin").stat().st_size > 0


def test_sanitized_fuzz(tmp_path: Path) -> None:
    """The three targets in one sanitized process (one build of the extension)."""
    gcc, _, include = TOOLS  # type: ignore[misc]
    pkg = _sanitized_package(tmp_path / "build", gcc, include)
    plan = {"zstd": 2500 * SCALE, "load": 250 * SCALE, "fbread": 1500 * SCALE}
    proc = _driver(pkg, plan, tmp_path / "out", timeout=600 * SCALE)
    assert problems(proc) == [], _report(proc)
    for name, cases in plan.items():
        assert f"{name}: {cases} cases" in proc.stdout, _report(proc)


def test_coverage_guided_zstd_fuzz_in_c(tmp_path: Path) -> None:
    """_zstd_inflate.c alone, coverage-guided, exact input and output buffers, against
    libzstd where it is installed."""
    import random

    import zstandard

    gcc, asan, _ = TOOLS  # type: ignore[misc]
    (tmp_path / "zfuzz.c").write_text(ZFUZZ_C)
    obj = tmp_path / "zstd_inflate.o"
    for cmd in ([gcc, "-c", *SAN, "-fsanitize-coverage=trace-pc", f"-I{SRC}",
                 str(SRC / "_zstd_inflate.c"), "-o", str(obj)],
                [gcc, *SAN, f"-I{SRC}", str(tmp_path / "zfuzz.c"), str(obj), "-ldl", "-o",
                 str(tmp_path / "zfuzz")]):
        built = subprocess.run(cmd, capture_output=True, text=True, check=False)
        assert built.returncode == 0, built.stderr
    seeds = tmp_path / "seeds"
    seeds.mkdir()
    rng, i = random.Random(SEED), 0
    from test_zstd_inflate import KINDS

    for kind in KINDS:
        for n in (0, 3, 100, 1500, 9000, 70000):
            data = KINDS[kind](n, random.Random(f"{kind}{n}"))
            for level in (-5, 1, 3, 9, 19):
                if rng.random() < 0.5:
                    continue
                flags = {"write_checksum": rng.random() < 0.6,
                         "write_content_size": rng.random() < 0.8}
                (seeds / f"{i:04d}.zst").write_bytes(
                    zstandard.ZstdCompressor(level=level, **flags).compress(data))
                i += 1
    env = _env(asan, None)
    env.pop("LD_PRELOAD")  # the harness links ASan itself
    proc = subprocess.run([str(tmp_path / "zfuzz"), str(seeds), str(tmp_path),
                           str(40000 * SCALE), str(SEED)], capture_output=True, text=True,
                          check=False, env=env, timeout=600 * SCALE)
    assert problems(proc) == [], _report(proc)
    assert f"zfuzz: {40000 * SCALE} execs" in proc.stdout, _report(proc)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
