/*
 * A fuzzing harness for kernelpack's zstd decoder (src/kernelpack/_zstd_inflate.c), to be
 * built with AddressSanitizer and UndefinedBehaviorSanitizer. Not part of CI: the tests
 * (tests/test_zstd_inflate.py) hold the decoder to the zstandard package on valid and damaged
 * frames, and this finds what a test cannot see: a read or write a byte out of bounds, an
 * undefined shift, an overflow.
 *
 * It mutates valid frames (bit flips, byte changes, "interesting" bytes, truncations, inserted,
 * deleted and duplicated runs, splices of two frames), decodes each with every entry point,
 * and checks what it can: no sanitizer report, a NUL-terminated message on every error, never
 * more output than allowed, exactly the declared size on success, and the original bytes for
 * every unmutated frame. Input and output buffers are malloc'd at their exact sizes, so one
 * byte past either is a sanitizer report. Light feedback, in place of coverage: a mutant whose
 * error message (numbers dropped) was never seen before joins the pool of frames to mutate, and
 * so does one in 64 mutants that decode.
 *
 * Run, from the repository root (2 cores: two seeds side by side):
 *
 *   gcc -std=c99 -O1 -g -fsanitize=address,undefined -fno-sanitize-recover=all \
 *       -Isrc/kernelpack tools/zstd_fuzz.c src/kernelpack/_zstd_inflate.c -o /tmp/zstd_fuzz
 *   .venv/bin/python - /tmp/zcorpus <<'EOF'
 *   import os, random, sys, zstandard as z
 *   out, rng = sys.argv[1], random.Random(0); os.makedirs(out, exist_ok=True)
 *   kinds = {"rand": lambda n: os.urandom(n), "zero": bytes,
 *            "text": lambda n: open("src/kernelpack/_images.py", "rb").read()[:n],
 *            "bin": lambda n: bytes((i * 7 ^ i >> 4) & (0xFF if i % 64 < 40 else 0)
 *                                   for i in range(n))}
 *   for kind, make in kinds.items():
 *       for n in (0, 1, 30, 700, 5000, 40000, 131072, 300000):
 *           for level in (-5, 1, 3, 9, 19):
 *               for ck in (0, 1):
 *                   data = make(n)
 *                   frame = z.ZstdCompressor(level=level, write_checksum=ck,
 *                                            write_content_size=rng.random() < 0.8).compress(data)
 *                   name = f"{out}/{kind}-{n}-{level}-{ck}"
 *                   open(name + ".zst", "wb").write(frame); open(name + ".raw", "wb").write(data)
 *   EOF
 *   /tmp/zstd_fuzz /tmp/zcorpus 300 1 & /tmp/zstd_fuzz /tmp/zcorpus 300 2; wait
 *
 * Arguments: the corpus folder (NAME.zst frames, with NAME.raw their content when known),
 * seconds to run (default 60), a seed (default 1). It prints its counts every 10 seconds and
 * at the end, and aborts with the sanitizer's report (or a "FAILED" line) on the first
 * finding.
 */
#define _POSIX_C_SOURCE 200809L
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "_zstd_inflate.h"

#define MAX_POOL 4096
#define MAX_KINDS 8192
#define CAP_LIMIT ((size_t)1 << 26) /* largest output buffer tried */

typedef struct {
    uint8_t *data;
    size_t len;
    uint8_t *raw; /* the content, or NULL */
    size_t raw_len;
} Item;

static Item pool[MAX_POOL];
static size_t npool, ninitial;
static uint64_t kinds[MAX_KINDS]; /* hashes of error messages seen (0: empty slot) */
static size_t nkinds;
static uint64_t rng_state;

static uint64_t next_random(void) { /* xorshift64* */
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return rng_state * 0x2545F4914F6CDD1DULL;
}

static size_t below(size_t n) { return n ? (size_t)(next_random() % n) : 0; }

static void die(const char *what, const uint8_t *frame, size_t len) {
    FILE *f = fopen("/tmp/zstd_fuzz_crash.zst", "wb");
    if (f) {
        fwrite(frame, 1, len, f);
        fclose(f);
    }
    fprintf(stderr, "FAILED: %s (input saved to /tmp/zstd_fuzz_crash.zst)\n", what);
    abort();
}

static uint8_t *read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    uint8_t *buf;
    long n;
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    n = ftell(f);
    fseek(f, 0, SEEK_SET);
    buf = malloc(n > 0 ? (size_t)n : 1);
    if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) {
        free(buf);
        buf = NULL;
    }
    fclose(f);
    *len = (size_t)n;
    return buf;
}

/* Adds a frame to the pool; when full, it replaces a found one (never an initial one). */
static void add(uint8_t *data, size_t len, uint8_t *raw, size_t raw_len) {
    size_t at;
    if (npool < MAX_POOL) {
        at = npool++;
    } else {
        at = ninitial + below(MAX_POOL - ninitial);
        free(pool[at].data);
        free(pool[at].raw);
    }
    pool[at].data = data;
    pool[at].len = len;
    pool[at].raw = raw;
    pool[at].raw_len = raw_len;
}

/* Whether a message of this kind (digits dropped) is new; remembers it. */
static int new_kind(const char *msg) {
    uint64_t h = 1469598103934665603ULL;
    size_t i;
    for (const char *p = msg; *p; p++) {
        if (p[0] == '0' && p[1] == 'x') { /* a hex value: skipped as the digits are */
            for (p += 2; p[0] && strchr("0123456789ABCDEFabcdef", p[0]); p++)
                ;
            if (!*p)
                break;
        }
        if (*p < '0' || *p > '9')
            h = (h ^ (uint8_t)*p) * 1099511628211ULL;
    }
    h |= 1;
    if (nkinds * 2 >= MAX_KINDS)
        return 0;
    for (i = h % MAX_KINDS; kinds[i]; i = (i + 1) % MAX_KINDS)
        if (kinds[i] == h)
            return 0;
    kinds[i] = h;
    nkinds++;
    return 1;
}

static size_t mutate(uint8_t *buf, size_t len, size_t room) {
    static const uint8_t interesting[] = {0, 1, 0x7F, 0x80, 0xFF, 0x3F, 0x40, 0xC0, 0x10, 0x20};
    int count = 1 + (int)below(next_random() % 4 == 0 ? 12 : 3);
    for (int k = 0; k < count; k++) {
        switch (below(9)) {
        case 0: case 1: /* flip a bit */
            if (len)
                buf[below(len)] ^= (uint8_t)(1u << below(8));
            break;
        case 2: /* set a byte */
            if (len)
                buf[below(len)] = (uint8_t)next_random();
            break;
        case 3: /* an interesting byte */
            if (len)
                buf[below(len)] = interesting[below(sizeof interesting)];
            break;
        case 4: /* truncate */
            len = below(len + 1);
            break;
        case 5: { /* insert a run */
            size_t at = below(len + 1), n = 1 + below(4);
            if (len + n > room)
                break;
            memmove(buf + at + n, buf + at, len - at);
            for (size_t i = 0; i < n; i++)
                buf[at + i] = below(2) ? 0 : (uint8_t)next_random();
            len += n;
            break;
        }
        case 6: { /* delete a run */
            size_t at = below(len), n = 1 + below(4);
            if (at + n > len)
                n = len - at;
            memmove(buf + at, buf + at + n, len - at - n);
            len -= n;
            break;
        }
        case 7: { /* duplicate a run inside the frame */
            size_t from = below(len), n = 1 + below(16), at = below(len + 1);
            if (from + n > len)
                n = len - from;
            if (len + n > room || n == 0)
                break;
            memmove(buf + at + n, buf + at, len - at);
            memmove(buf + at, buf + (from >= at ? from + n : from), n);
            len += n;
            break;
        }
        default: { /* splice: the tail of another frame */
            const Item *o = &pool[below(npool)];
            size_t at = below(len + 1), from = below(o->len + 1), n = o->len - from;
            if (at + n > room)
                n = room - at;
            memcpy(buf + at, o->data + from, n);
            len = at + n;
            break;
        }
        }
    }
    return len;
}

/* Runs every entry point on frame[0, len) (an exact-size copy); 1 if it decoded. */
static int run(const uint8_t *frame, size_t len, size_t cap, const Item *original, int check_raw,
               unsigned long *ok, int *fresh) {
    char err[KP_ZSTD_ERROR_SIZE];
    uint8_t *in = malloc(len ? len : 1), *out;
    uint64_t declared = 0;
    size_t size = 0, got = (size_t)-1;
    int rc_cs, rc;
    memcpy(in, frame, len);
    memset(err, 'x', sizeof err);
    rc_cs = kp_zstd_content_size(in, len, &declared, err);
    if (rc_cs == KP_ZSTD_CORRUPT && memchr(err, 0, sizeof err) == NULL)
        die("content size error without a terminated message", frame, len);
    memset(err, 'x', sizeof err);
    if (kp_zstd_frame_size(in, len, &size, err) == KP_ZSTD_OK) {
        if (size > len)
            die("frame size past the input", frame, len);
    } else if (memchr(err, 0, sizeof err) == NULL) {
        die("frame size error without a terminated message", frame, len);
    }
    out = malloc(cap ? cap : 1);
    memset(err, 'x', sizeof err);
    rc = kp_zstd_decompress(in, len, out, cap, &got, err);
    if (rc == KP_ZSTD_OK) {
        ++*ok;
        if (got > cap)
            die("more output than allowed", frame, len);
        if (rc_cs == KP_ZSTD_OK && got != declared)
            die("decoded size differs from the declared one", frame, len);
        if (rc_cs == KP_ZSTD_CORRUPT)
            die("decoded a frame whose header is refused", frame, len);
        if (check_raw && (got != original->raw_len || memcmp(out, original->raw, got) != 0))
            die("a valid frame decoded to other bytes", frame, len);
    } else {
        if (memchr(err, 0, sizeof err) == NULL || err[0] == 0)
            die("an error without a message", frame, len);
        if (check_raw)
            die(err, frame, len);
        *fresh = new_kind(err);
    }
    free(out);
    free(in);
    return rc == KP_ZSTD_OK;
}

int main(int argc, char **argv) {
    const char *dir = argc > 1 ? argv[1] : NULL;
    double seconds = argc > 2 ? atof(argv[2]) : 60;
    unsigned long seed = argc > 3 ? strtoul(argv[3], NULL, 10) : 1, runs = 0, ok = 0;
    struct timespec t0, now;
    double last_report = 0, elapsed;
    DIR *d;
    struct dirent *e;
    uint8_t *buf;
    size_t room = 0;
    if (dir == NULL || (d = opendir(dir)) == NULL) {
        fprintf(stderr, "usage: %s CORPUS_DIR [SECONDS] [SEED] (see the top of tools/zstd_fuzz.c)\n",
                argv[0]);
        return 2;
    }
    rng_state = 0x9E3779B97F4A7C15ULL ^ (seed * 0x100000001B3ULL);
    while ((e = readdir(d)) != NULL && npool < MAX_POOL / 2) {
        char path[4096];
        size_t n = strlen(e->d_name), len, raw_len = 0;
        uint8_t *data, *raw;
        if (n < 5 || strcmp(e->d_name + n - 4, ".zst") != 0)
            continue;
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        if ((data = read_file(path, &len)) == NULL)
            continue;
        snprintf(path, sizeof path, "%s/%.*s.raw", dir, (int)(n - 4), e->d_name);
        raw = read_file(path, &raw_len);
        add(data, len, raw, raw_len);
        if (len > room)
            room = len;
    }
    closedir(d);
    ninitial = npool;
    if (npool == 0) {
        fprintf(stderr, "no .zst files in %s\n", dir);
        return 2;
    }
    room = room * 2 + 64;
    buf = malloc(room);
    for (size_t i = 0; i < ninitial; i++) { /* every valid frame decodes to its content */
        int fresh = 0;
        if (pool[i].raw)
            run(pool[i].data, pool[i].len, pool[i].raw_len, &pool[i], 1, &ok, &fresh);
    }
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (;;) {
        /* half the time a frame as the compressor wrote it, else one found on the way */
        const Item *it = &pool[below(2) ? below(ninitial) : below(npool)];
        size_t len, cap;
        uint64_t declared;
        char err[KP_ZSTD_ERROR_SIZE];
        int fresh = 0, decoded;
        memcpy(buf, it->data, it->len);
        len = mutate(buf, it->len, room);
        /* the output allowed: the declared size (as the loader's raw_size), the original's,
         * or something else now and then */
        if (kp_zstd_content_size(buf, len, &declared, err) == KP_ZSTD_OK && declared < CAP_LIMIT)
            cap = (size_t)declared;
        else
            cap = it->raw ? it->raw_len : below((size_t)1 << 20);
        switch (below(16)) {
        case 0: cap = below(cap + 1); break;
        case 1: cap += below(4096); break;
        case 2: cap = cap ? cap - 1 : 0; break;
        }
        decoded = run(buf, len, cap, it, 0, &ok, &fresh);
        runs++;
        if ((fresh || (decoded && below(64) == 0)) && len > 0) {
            uint8_t *keep = malloc(len);
            memcpy(keep, buf, len);
            add(keep, len, NULL, 0);
        }
        if ((runs & 1023) == 0) {
            clock_gettime(CLOCK_MONOTONIC, &now);
            elapsed = (double)(now.tv_sec - t0.tv_sec) + (double)(now.tv_nsec - t0.tv_nsec) / 1e9;
            if (elapsed - last_report >= 10 || elapsed >= seconds) {
                last_report = elapsed;
                printf("seed %lu: %.0f s, %lu inputs, %lu decoded, %zu error kinds, pool %zu\n",
                       seed, elapsed, runs, ok, nkinds, npool);
                fflush(stdout);
            }
            if (elapsed >= seconds)
                break;
        }
    }
    free(buf);
    return 0;
}
