/*
 * A zstd frame decoder for kernelpack's load path, written from the format's specification
 * (RFC 8878, "Zstandard Compression and the application/zstd Media Type"; section numbers
 * below are the RFC's).
 *
 * Why: a process's first kernel load decompresses one frame (a cubin, 4 KB to a few MB), and
 * opening the system's libzstd for it (dlopen, ~170 us) was the largest fixed cost left on that
 * path. This decoder is compiled into the extension: no dlopen, no dependency on libzstd.
 *
 * Scope: the first frame of the input, a Zstandard frame (RFC 3.1.1) without a dictionary;
 * raw, RLE and compressed blocks; every literals and sequences encoding; the content checksum
 * (XXH64, verified when the frame has one). A skippable frame or a dictionary ID is refused
 * with words that say so. The whole output is the caller's buffer, so matches copy from
 * earlier output and no window buffer is kept; offsets may reach anywhere in the output
 * decoded so far (as libzstd's one-shot decoder allows), never before its start.
 *
 * Safety: the input is untrusted. Every read is bounded by the input (or by a section's
 * declared size inside it), every write by the caller's capacity, every table description
 * is checked against the RFC's limits before a table is built from it, and every failure
 * is KP_ZSTD_CORRUPT with a specific message. The fast paths copy 16 bytes at a time only
 * where the destination has WILD bytes of room and the source that many readable bytes;
 * the bytes written past a copy's end are overwritten by the next copy or lie beyond the
 * output's final length. No global mutable state: a call's tables live in memory it
 * allocates and frees.
 */
#include "_zstd_inflate.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FRAME_MAGIC 0xFD2FB528u
#define SKIPPABLE_MAGIC 0x184D2A50u /* to 0x184D2A5F */
#define MAX_WINDOW_LOG 31           /* 2 GiB: libzstd's limit on 64-bit hosts */
#define BLOCK_SIZE_MAX (128u * 1024) /* RFC 3.1.1.2.4 */
#define HUF_MAX_BITS 11              /* RFC 4.2.1: Max_Number_of_Bits */
#define HUF_MAX_WEIGHTS 255          /* decoded weights; the 256th symbol's is implied */
#define HUF_WEIGHT_LOG_MAX 6         /* accuracy log of the weights' FSE table */
#define LL_LOG_MAX 9
#define ML_LOG_MAX 9
#define OF_LOG_MAX 8
#define LL_CODE_MAX 35
#define ML_CODE_MAX 52
#define OF_CODE_MAX 31
#define WILD 32 /* room the wide copies need past a copy's end */

#if defined(__GNUC__)
#define LIKELY(x) __builtin_expect(!!(x), 1)
#define UNLIKELY(x) __builtin_expect(!!(x), 0)
#else
#define LIKELY(x) (x)
#define UNLIKELY(x) (x)
#endif

/* ---------------------------------------------------------------- small helpers */

static int fail(char *err, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, KP_ZSTD_ERROR_SIZE, fmt, ap);
    va_end(ap);
    return KP_ZSTD_CORRUPT;
}

static uint32_t le16(const uint8_t *p) { return (uint32_t)p[0] | (uint32_t)p[1] << 8; }
static uint32_t le24(const uint8_t *p) { return le16(p) | (uint32_t)p[2] << 16; }
static uint32_t le32(const uint8_t *p) { return le24(p) | (uint32_t)p[3] << 24; }

static inline uint64_t le64(const uint8_t *p) {
    uint64_t v;
    memcpy(&v, p, 8);
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
    v = __builtin_bswap64(v);
#endif
    return v;
}

/* Index of the highest set bit of v (v > 0). */
static inline unsigned highbit(uint32_t v) {
#if defined(__GNUC__)
    return 31u - (unsigned)__builtin_clz(v);
#else
    unsigned n = 0;
    while (v >>= 1)
        n++;
    return n;
#endif
}

/* ---------------------------------------------------------------- XXH64 (content checksum) */

#define P64_1 0x9E3779B185EBCA87ULL
#define P64_2 0xC2B2AE3D27D4EB4FULL
#define P64_3 0x165667B19E3779F9ULL
#define P64_4 0x85EBCA77C2B2AE63ULL
#define P64_5 0x27D4EB2F165667C5ULL

static inline uint64_t rotl64(uint64_t x, unsigned r) { return (x << r) | (x >> (64 - r)); }

static inline uint64_t xxh_round(uint64_t acc, uint64_t lane) {
    acc += lane * P64_2;
    return rotl64(acc, 31) * P64_1;
}

static inline uint64_t xxh_merge(uint64_t acc, uint64_t v) {
    acc ^= xxh_round(0, v);
    return acc * P64_1 + P64_4;
}

/* XXH64 of p[0, n) with seed 0 (RFC 3.1.1: Content_Checksum is its low 32 bits). */
static uint64_t xxh64(const uint8_t *p, size_t n) {
    const uint8_t *end = p + n;
    uint64_t acc;
    if (n >= 32) {
        uint64_t v1 = P64_1 + P64_2, v2 = P64_2, v3 = 0, v4 = 0 - P64_1;
        const uint8_t *limit = end - 32;
        do {
            v1 = xxh_round(v1, le64(p));
            v2 = xxh_round(v2, le64(p + 8));
            v3 = xxh_round(v3, le64(p + 16));
            v4 = xxh_round(v4, le64(p + 24));
            p += 32;
        } while (p <= limit);
        acc = rotl64(v1, 1) + rotl64(v2, 7) + rotl64(v3, 12) + rotl64(v4, 18);
        acc = xxh_merge(acc, v1);
        acc = xxh_merge(acc, v2);
        acc = xxh_merge(acc, v3);
        acc = xxh_merge(acc, v4);
    } else {
        acc = P64_5;
    }
    acc += (uint64_t)n;
    for (; end - p >= 8; p += 8) {
        acc ^= xxh_round(0, le64(p));
        acc = rotl64(acc, 27) * P64_1 + P64_4;
    }
    if (end - p >= 4) {
        acc ^= (uint64_t)le32(p) * P64_1;
        acc = rotl64(acc, 23) * P64_2 + P64_3;
        p += 4;
    }
    for (; p < end; p++) {
        acc ^= (uint64_t)*p * P64_5;
        acc = rotl64(acc, 11) * P64_1;
    }
    acc ^= acc >> 33;
    acc *= P64_2;
    acc ^= acc >> 29;
    acc *= P64_3;
    acc ^= acc >> 32;
    return acc;
}

/* ---------------------------------------------------------------- frame header (RFC 3.1.1.1) */

typedef struct {
    uint64_t content_size;
    int has_content_size;
    uint64_t window;
    int checksum;
    uint32_t dict_id;
    size_t size; /* magic number included */
} Header;

static int read_header(const uint8_t *src, size_t len, Header *h, char *err) {
    uint32_t magic;
    unsigned desc, fcs_code, single, did_code, fcs_bytes, did_bytes;
    size_t need, pos;
    if (len < 4)
        return fail(err, "frame truncated at offset %zu: a frame starts with a 4-byte magic "
                    "number", len);
    magic = le32(src);
    if ((magic & 0xFFFFFFF0u) == SKIPPABLE_MAGIC)
        return fail(err, "skippable frame (magic number 0x%08X) where a zstd frame was expected",
                    (unsigned)magic);
    if (magic != FRAME_MAGIC)
        return fail(err, "not a zstd frame: magic number 0x%08X, expected 0x%08X",
                    (unsigned)magic, FRAME_MAGIC);
    if (len < 5)
        return fail(err, "frame truncated at offset 4: no frame header descriptor");
    desc = src[4];
    fcs_code = desc >> 6;
    single = (desc >> 5) & 1;
    did_code = desc & 3;
    if (desc & 0x08)
        return fail(err, "frame header: reserved bit 3 of the descriptor (0x%02X) is set", desc);
    fcs_bytes = fcs_code == 0 ? single : 1u << fcs_code;
    did_bytes = did_code == 3 ? 4 : did_code;
    need = 5 + (size_t)!single + did_bytes + fcs_bytes;
    if (len < need)
        return fail(err, "frame truncated at offset %zu: the frame header needs %zu bytes", len,
                    need);
    pos = 5;
    h->window = 0;
    if (!single) {
        /* the window does not size any buffer here (the output is the window), but a frame
         * asking for more than 2 GiB is no image of ours: refused, as libzstd refuses it */
        unsigned wd = src[pos++], log = 10 + (wd >> 3);
        if (log > MAX_WINDOW_LOG || (log == MAX_WINDOW_LOG && (wd & 7)))
            return fail(err, "frame header: window size 2^%u + %u/8 exceeds the maximum 2^%d",
                        log, wd & 7, MAX_WINDOW_LOG);
        h->window = ((uint64_t)1 << log) + (((uint64_t)1 << log) >> 3) * (wd & 7);
    }
    h->dict_id = 0;
    switch (did_bytes) {
    case 1: h->dict_id = src[pos]; break;
    case 2: h->dict_id = le16(src + pos); break;
    case 4: h->dict_id = le32(src + pos); break;
    }
    pos += did_bytes;
    h->has_content_size = fcs_bytes != 0;
    switch (fcs_bytes) {
    case 0: h->content_size = 0; break;
    case 1: h->content_size = src[pos]; break;
    case 2: h->content_size = le16(src + pos) + 256u; break;
    case 4: h->content_size = le32(src + pos); break;
    default: h->content_size = le32(src + pos) | (uint64_t)le32(src + pos + 4) << 32; break;
    }
    if (single)
        h->window = h->content_size;
    h->checksum = (desc >> 2) & 1;
    h->size = need;
    return KP_ZSTD_OK;
}

int kp_zstd_content_size(const uint8_t *src, size_t len, uint64_t *size, char *err) {
    Header h;
    if (read_header(src, len, &h, err) != KP_ZSTD_OK)
        return KP_ZSTD_CORRUPT;
    *size = h.content_size;
    return h.has_content_size ? KP_ZSTD_OK : KP_ZSTD_UNKNOWN;
}

static size_t block_maximum(const Header *h) {
    return h->window < BLOCK_SIZE_MAX ? (size_t)h->window : BLOCK_SIZE_MAX;
}

int kp_zstd_frame_size(const uint8_t *src, size_t len, size_t *size, char *err) {
    Header h;
    size_t pos, block_max;
    if (read_header(src, len, &h, err) != KP_ZSTD_OK)
        return KP_ZSTD_CORRUPT;
    block_max = block_maximum(&h);
    pos = h.size;
    for (;;) {
        uint32_t bh, type, bsize;
        size_t at = pos;
        if (len - pos < 3)
            return fail(err, "frame truncated at offset %zu: a block header needs 3 bytes", len);
        bh = le24(src + pos);
        pos += 3;
        type = (bh >> 1) & 3;
        bsize = bh >> 3;
        if (type == 3)
            return fail(err, "block at offset %zu: reserved block type 3", at);
        if (bsize > block_max)
            return fail(err, "block at offset %zu: size %u exceeds the block maximum %zu", at,
                        (unsigned)bsize, block_max);
        if (type == 1)
            bsize = 1; /* RLE: one byte stored */
        if (len - pos < bsize)
            return fail(err, "frame truncated at offset %zu: block at offset %zu needs %u "
                        "bytes", len, at, (unsigned)bsize);
        pos += bsize;
        if (bh & 1)
            break;
    }
    if (h.checksum) {
        if (len - pos < 4)
            return fail(err, "frame truncated at offset %zu: the content checksum needs 4 bytes",
                        len);
        pos += 4;
    }
    *size = pos;
    return KP_ZSTD_OK;
}

/* ---------------------------------------------------------------- backward bit streams
 *
 * Huffman streams and the sequences bitstream (RFC 4.1, 4.2.2) are read from their last byte
 * towards their first, highest bit first; the last byte's highest set bit marks where the
 * data starts. `bits` holds the 8 bytes at start + pos (little-endian: the byte nearest the
 * end on top; a stream shorter than 8 bytes is zero-extended on top and counted as already
 * used), `used` counts the bits taken from the top. The stream is exactly consumed when pos is
 * 0 and used is 64; more than 64 there means a read past its start, which reads zeros (so the
 * decoders need not check every read) and is an error at the end of every stream.
 */

typedef struct {
    uint64_t bits;
    unsigned used;
    size_t pos;
    const uint8_t *start;
} BackBits;

static int bb_init(BackBits *b, const uint8_t *p, size_t n) {
    uint8_t last;
    if (n == 0)
        return -1;
    last = p[n - 1];
    if (last == 0)
        return -2; /* no end marker */
    b->start = p;
    if (n >= 8) {
        b->pos = n - 8;
        b->bits = le64(p + b->pos);
        b->used = 8 - highbit(last);
    } else {
        uint64_t v = 0;
        for (size_t i = 0; i < n; i++)
            v |= (uint64_t)p[i] << (8 * i);
        b->pos = 0;
        b->bits = v;
        b->used = (unsigned)(8 - n) * 8 + 8 - highbit(last);
    }
    return 0;
}

/* Moves the 8-byte view towards the start so that fewer than 8 used bits remain in it (all of
 * them once at the start). A stream shorter than 8 bytes is never reloaded: its view starts
 * with more than 8 bits counted as used, so step > pos = 0 always, and no 8-byte load can
 * reach past its end. */
static inline void bb_refill(BackBits *b) {
    size_t step = b->used >> 3;
    if (step <= b->pos) {
        b->pos -= step;
        b->used &= 7;
        b->bits = le64(b->start + b->pos);
    } else if (b->pos > 0) { /* a stream of 8 bytes or more: move the view to its start */
        b->used -= (unsigned)b->pos * 8;
        b->pos = 0;
        b->bits = le64(b->start);
    }
}

/* The next n bits (n <= 32), zeros past the stream's start. */
static inline uint32_t bb_read(BackBits *b, unsigned n) {
    uint64_t v = b->used < 64 ? (b->bits << b->used) >> 1 >> (63 - n) : 0;
    b->used += n;
    return (uint32_t)v;
}

/* The next n bits (n <= 32) when used + n < 64 is known: no check. */
static inline uint32_t bb_read_in(BackBits *b, unsigned n) {
    uint64_t v = (b->bits << b->used) >> 1 >> (63 - n);
    b->used += n;
    return (uint32_t)v;
}

static inline int bb_overread(const BackBits *b) { return b->pos == 0 && b->used > 64; }
static inline int bb_done(const BackBits *b) { return b->pos == 0 && b->used == 64; }

/* ---------------------------------------------------------------- FSE tables (RFC 4.1) */

typedef struct {
    uint16_t base; /* next state = base + the next nbits bits */
    uint8_t nbits;
    uint8_t symbol;
} FseEntry;

/* A state of a sequences table: the FSE entry plus the value its code stands for. */
typedef struct {
    uint32_t value; /* literal length / match length base, or 1 << offset code */
    uint16_t base;
    uint8_t nbits;
    uint8_t extra; /* bits read after the code for the value */
} SeqEntry;

/* The 24 bits of p[0, n) from bit `bit` on (little-endian, lowest first), zeros past n. */
static inline uint32_t peek_forward(const uint8_t *p, size_t n, size_t bit) {
    size_t at = bit >> 3;
    uint32_t v = 0;
    for (unsigned k = 0; k < 4 && at + k < n; k++)
        v |= (uint32_t)p[at + k] << (8 * k);
    return v >> (bit & 7);
}

/* Reads an FSE table description (RFC 4.1.1) from p[0, n): fills norm[0..maxsym] (-1 for
 * "less than 1"), *log and *used (bytes). The forward bitstream is read through a window that
 * gives zeros past n; a description that needs them is refused as truncated. */
static int read_fse_description(const uint8_t *p, size_t n, unsigned maxsym, unsigned maxlog,
                                int16_t *norm, unsigned *log, size_t *used, const char *what,
                                char *err) {
    size_t bitpos = 4;
    int remaining, threshold;
    unsigned nb, sym = 0, al;
    if (n < 1)
        return fail(err, "%s FSE table description is missing", what);
    al = (p[0] & 15) + 5;
    if (al > maxlog)
        return fail(err, "%s FSE table: accuracy log %u exceeds the maximum %u", what, al,
                    maxlog);
    remaining = (1 << al) + 1;
    threshold = 1 << al;
    nb = al + 1;
    while (remaining > 1) {
        uint32_t v;
        int max, count;
        if (sym > maxsym)
            return fail(err, "%s FSE table: probabilities for more than %u symbols (they do not "
                        "sum to %d)", what, maxsym + 1, 1 << al);
        v = peek_forward(p, n, bitpos) & ((1u << nb) - 1); /* nb <= 10 */
        max = 2 * threshold - 1 - remaining;
        if ((int)(v & (uint32_t)(threshold - 1)) < max) {
            count = (int)(v & (uint32_t)(threshold - 1));
            bitpos += nb - 1;
        } else {
            count = (int)(v & (uint32_t)(2 * threshold - 1));
            if (count >= threshold)
                count -= max;
            bitpos += nb;
        }
        count -= 1; /* the probability: -1 is "less than 1" */
        norm[sym++] = (int16_t)count;
        remaining -= count < 0 ? -count : count;
        if (count == 0) { /* 2-bit repeat flags: how many more zeros follow */
            for (;;) {
                unsigned repeat = peek_forward(p, n, bitpos) & 3;
                bitpos += 2;
                if (bitpos > 8 * n)
                    return fail(err, "%s FSE table description is truncated", what);
                if (sym + repeat > maxsym + 1)
                    return fail(err, "%s FSE table: zero probabilities past symbol %u", what,
                                maxsym);
                for (unsigned k = 0; k < repeat; k++)
                    norm[sym++] = 0;
                if (repeat != 3)
                    break;
            }
        }
        if (remaining < 1)
            return fail(err, "%s FSE table: probabilities sum past %d", what, 1 << al);
        while (remaining < threshold) {
            nb--;
            threshold >>= 1;
        }
        if (bitpos > 8 * n)
            return fail(err, "%s FSE table description is truncated", what);
    }
    for (unsigned s = sym; s <= maxsym; s++)
        norm[s] = 0;
    *log = al;
    *used = (bitpos + 7) >> 3;
    return KP_ZSTD_OK;
}

/* Builds the decoding table of a checked distribution (RFC 4.1.1, "FSE Table Description"):
 * "less than 1" symbols at the top, the others spread by the RFC's step, then each state's
 * bit count and base from its symbol's running count. */
static int build_fse(const int16_t *norm, unsigned maxsym, unsigned log, FseEntry *table,
                     const char *what, char *err) {
    uint16_t next[256];
    unsigned size = 1u << log, high = size - 1, mask = size - 1, pos = 0;
    unsigned step = (size >> 1) + (size >> 3) + 3;
    for (unsigned s = 0; s <= maxsym; s++) {
        if (norm[s] == -1) {
            table[high--].symbol = (uint8_t)s; /* never wraps: the probabilities sum to size */
            next[s] = 1;
        } else {
            next[s] = (uint16_t)norm[s];
        }
    }
    for (unsigned s = 0; s <= maxsym; s++) {
        for (int i = 0; i < norm[s]; i++) {
            table[pos].symbol = (uint8_t)s;
            do
                pos = (pos + step) & mask;
            while (pos > high);
        }
    }
    if (pos != 0) /* unreachable for a distribution summing to size; kept as the RFC's check */
        return fail(err, "%s FSE table: the symbols do not fill the table", what);
    for (unsigned u = 0; u < size; u++) {
        unsigned x = next[table[u].symbol]++;
        unsigned nb = log - highbit(x);
        table[u].nbits = (uint8_t)nb;
        table[u].base = (uint16_t)((x << nb) - size);
    }
    return KP_ZSTD_OK;
}

/* ---------------------------------------------------------------- sequences' codes (RFC 3.1.1.3.2.1) */

static const uint32_t LL_BASE[LL_CODE_MAX + 1] = {
    0,  1,  2,  3,  4,  5,  6,  7,  8,   9,   10,  11,  12,   13,   14,   15,   16,   18,
    20, 22, 24, 28, 32, 40, 48, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536};
static const uint8_t LL_BITS[LL_CODE_MAX + 1] = {0, 0, 0, 0, 0, 0, 0, 0, 0,  0,  0,  0,
                                                 0, 0, 0, 0, 1, 1, 1, 1, 2,  2,  3,  3,
                                                 4, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16};
static const uint32_t ML_BASE[ML_CODE_MAX + 1] = {
    3,  4,  5,  6,  7,  8,  9,  10, 11,  12,  13,  14,  15,   16,   17,   18,    19,    20,
    21, 22, 23, 24, 25, 26, 27, 28, 29,  30,  31,  32,  33,   34,   35,   37,    39,    41,
    43, 47, 51, 59, 67, 83, 99, 131, 259, 515, 1027, 2051, 4099, 8195, 16387, 32771, 65539};
static const uint8_t ML_BITS[ML_CODE_MAX + 1] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
                                                 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
                                                 0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 3, 3, 4, 4,
                                                 5, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16};

/* Predefined distributions (RFC 3.1.1.3.2.2). */
static const int16_t LL_DEFAULT[36] = {4, 3, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 1, 1, 1, 2, 2,
                                       2, 2, 2, 2, 2, 2, 2, 3, 2, 1, 1, 1, 1, 1, -1, -1, -1, -1};
static const int16_t ML_DEFAULT[53] = {1, 4, 3, 2, 2, 2, 2, 2, 2, 1, 1, 1, 1, 1, 1, 1, 1, 1,
                                       1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1,
                                       1, 1, 1, 1, 1, 1, 1, 1, 1, 1, -1, -1, -1, -1, -1, -1, -1};
static const int16_t OF_DEFAULT[29] = {1, 1, 1, 1, 1, 1, 2, 2, 2, 1, 1, 1, 1, 1, 1,
                                       1, 1, 1, 1, 1, 1, 1, 1, 1, -1, -1, -1, -1, -1};

enum { KIND_LL = 0, KIND_OF = 1, KIND_ML = 2 };
static const char *const KIND_NAME[3] = {"literal lengths", "offsets", "match lengths"};
static const unsigned KIND_CODE_MAX[3] = {LL_CODE_MAX, OF_CODE_MAX, ML_CODE_MAX};
static const unsigned KIND_LOG_MAX[3] = {LL_LOG_MAX, OF_LOG_MAX, ML_LOG_MAX};

static void seq_entry_value(SeqEntry *e, int kind, unsigned code) {
    if (kind == KIND_LL) {
        e->value = LL_BASE[code];
        e->extra = LL_BITS[code];
    } else if (kind == KIND_ML) {
        e->value = ML_BASE[code];
        e->extra = ML_BITS[code];
    } else {
        e->value = (uint32_t)1 << code;
        e->extra = (uint8_t)code;
    }
}

/* ---------------------------------------------------------------- per-frame state */

typedef struct {
    uint16_t huf[1 << HUF_MAX_BITS]; /* symbol | bits << 8, indexed by the next huf_bits bits */
    unsigned huf_bits;               /* 0: no Huffman table yet (treeless literals refused) */
    SeqEntry seq[3][1 << LL_LOG_MAX];
    unsigned seq_log[3];
    int seq_have[3]; /* whether a table exists for the repeat mode */
    uint32_t rep[3];
    size_t lits_cap; /* literals buffer size, WILD bytes of slack excluded */
    uint8_t lits[];
} Ctx;

/* ---------------------------------------------------------------- Huffman literals (RFC 4.2) */

/* Builds the decoding table from n decoded weights (the last symbol's is implied). */
static int build_huffman(Ctx *c, uint8_t *w, unsigned n, char *err) {
    uint32_t total = 0, rem, start[HUF_MAX_BITS + 2];
    unsigned maxbits, count[HUF_MAX_BITS + 2] = {0}, last;
    for (unsigned i = 0; i < n; i++) {
        if (w[i] > HUF_MAX_BITS)
            return fail(err, "Huffman weight %u of symbol %u exceeds %d", w[i], i, HUF_MAX_BITS);
        if (w[i])
            total += (uint32_t)1 << (w[i] - 1);
    }
    if (total == 0)
        return fail(err, "Huffman weights are all zero");
    maxbits = highbit(total) + 1;
    if (maxbits > HUF_MAX_BITS)
        return fail(err, "Huffman weights need %u bits, more than %d", maxbits, HUF_MAX_BITS);
    rem = ((uint32_t)1 << maxbits) - total;
    if (rem & (rem - 1))
        return fail(err, "Huffman weights do not complete a prefix code (%u short of %u)",
                    (unsigned)rem, 1u << maxbits);
    last = highbit(rem) + 1;
    w[n++] = (uint8_t)last;
    for (unsigned i = 0; i < n; i++)
        count[w[i]]++;
    /* codes by weight, lowest first (longest codes), each weight's symbols in order: the
     * table slot of a code is its value left-aligned to maxbits */
    start[1] = 0;
    for (unsigned k = 1; k <= maxbits; k++)
        start[k + 1] = start[k] + (count[k] << (k - 1));
    for (unsigned s = 0; s < n; s++) {
        unsigned k = w[s];
        if (k) {
            uint16_t e = (uint16_t)(s | (maxbits + 1 - k) << 8);
            uint32_t at = start[k], span = (uint32_t)1 << (k - 1);
            if (span >= 4) { /* spans of 4 and more start at multiples of 4: 8-byte stores */
                uint64_t four = e * 0x0001000100010001ULL;
                for (uint32_t j = 0; j < span; j += 4)
                    memcpy(&c->huf[at + j], &four, 8);
            } else {
                for (uint32_t j = 0; j < span; j++)
                    c->huf[at + j] = e;
            }
            start[k] = at + span;
        }
    }
    c->huf_bits = maxbits;
    return KP_ZSTD_OK;
}

/* Reads a Huffman tree description (RFC 4.2.1) from p[0, n); *used: its size. */
static int read_huffman_tree(Ctx *c, const uint8_t *p, size_t n, size_t *used, char *err) {
    uint8_t w[HUF_MAX_WEIGHTS + 2];
    unsigned count = 0, hdr;
    if (n < 1)
        return fail(err, "Huffman tree description is missing");
    hdr = p[0];
    if (hdr >= 128) { /* direct: 4 bits per weight */
        unsigned k = hdr - 127;
        size_t bytes = (k + 1) / 2;
        if (n - 1 < bytes)
            return fail(err, "Huffman tree description: %u weights need %zu bytes, %zu left",
                        k, bytes, n - 1);
        for (unsigned i = 0; i < k; i++)
            w[i] = (uint8_t)(i & 1 ? p[1 + i / 2] & 15 : p[1 + i / 2] >> 4);
        count = k;
        *used = 1 + bytes;
    } else { /* FSE-compressed weights, two interleaved states */
        int16_t norm[HUF_MAX_BITS + 1];
        FseEntry t[1 << HUF_WEIGHT_LOG_MAX];
        unsigned log, s1, s2;
        size_t desc;
        BackBits b;
        if (hdr == 0 || n - 1 < hdr)
            return fail(err, "Huffman tree description: %u compressed bytes, %zu left", hdr,
                        n - 1);
        if (read_fse_description(p + 1, hdr, HUF_MAX_BITS, HUF_WEIGHT_LOG_MAX, norm, &log, &desc,
                                 "Huffman weights", err) != KP_ZSTD_OK ||
            build_fse(norm, HUF_MAX_BITS, log, t, "Huffman weights", err) != KP_ZSTD_OK)
            return KP_ZSTD_CORRUPT;
        if (desc >= hdr || bb_init(&b, p + 1 + desc, hdr - desc) != 0)
            return fail(err, "Huffman weights: the bitstream is empty or has no end marker");
        s1 = bb_read(&b, log);
        s2 = bb_read(&b, log);
        /* RFC 4.2.1.2: alternate the states until an update reads past the stream's start,
         * then take the other state's symbol */
        for (;;) { /* one refill per pair: 2 x 6 bits fit after it */
            if (count >= HUF_MAX_WEIGHTS - 1)
                return fail(err, "Huffman weights: more than %d", HUF_MAX_WEIGHTS);
            bb_refill(&b);
            w[count++] = t[s1].symbol;
            s1 = t[s1].base + bb_read(&b, t[s1].nbits);
            if (bb_overread(&b)) {
                w[count++] = t[s2].symbol;
                break;
            }
            if (count >= HUF_MAX_WEIGHTS - 1)
                return fail(err, "Huffman weights: more than %d", HUF_MAX_WEIGHTS);
            w[count++] = t[s2].symbol;
            s2 = t[s2].base + bb_read(&b, t[s2].nbits);
            if (bb_overread(&b)) {
                w[count++] = t[s1].symbol;
                break;
            }
        }
        *used = 1 + hdr;
    }
    return build_huffman(c, w, count, err);
}

/* One Huffman stream, the careful way: refilled and checked before every symbol. */
static void huf_tail(const Ctx *c, BackBits *b, uint8_t *o, uint8_t *end) {
    unsigned bits = c->huf_bits;
    while (o < end && !bb_overread(b)) {
        uint16_t e;
        bb_refill(b);
        e = c->huf[b->used < 64 ? (b->bits << b->used) >> (64 - bits) : 0];
        *o++ = (uint8_t)e;
        b->used += e >> 8;
        bb_refill(b);
    }
    while (o < end) /* the stream ran out: what is left is garbage, refused by the caller */
        *o++ = 0;
}

#define HUF_STEP(b, o)                                                                  \
    do {                                                                                \
        uint16_t e_ = huf[((b).bits << (b).used) >> shift];                             \
        *(o)++ = (uint8_t)e_;                                                           \
        (b).used += e_ >> 8;                                                            \
    } while (0)

#define HUF_FAST_REFILL(b)                                                              \
    do {                                                                                \
        (b).pos -= (b).used >> 3;                                                       \
        (b).used &= 7;                                                                  \
        (b).bits = le64((b).start + (b).pos);                                           \
    } while (0)

/* Decodes Huffman-compressed literals (1 or 4 streams, RFC 4.2.2) from p[0, n) into out[0,
 * regen). Four streams are decoded side by side, five symbols per stream between refills
 * (5 x 11 bits fit the 57 left after a refill) while every stream has 8 bytes to go. */
static int huf_decode(const Ctx *c, const uint8_t *p, size_t n, uint8_t *out, size_t regen,
                      int four, char *err) {
    const uint16_t *huf = c->huf;
    unsigned shift = 64 - c->huf_bits;
    BackBits b[4];
    uint8_t *o[4], *end[4];
    int streams = four ? 4 : 1;
    if (!four) {
        if (bb_init(&b[0], p, n) != 0)
            return fail(err, "Huffman stream is empty or has no end marker");
        o[0] = out;
        end[0] = out + regen;
    } else {
        size_t sz[4], seg = (regen + 3) / 4, at = 6;
        if (n < 6)
            return fail(err, "Huffman literals: %zu bytes, the jump table needs 6", n);
        sz[0] = le16(p);
        sz[1] = le16(p + 2);
        sz[2] = le16(p + 4);
        if (sz[0] + sz[1] + sz[2] > n - 6)
            return fail(err, "Huffman jump table: streams of %zu bytes in %zu",
                        sz[0] + sz[1] + sz[2], n - 6);
        sz[3] = n - 6 - sz[0] - sz[1] - sz[2];
        /* libzstd (MIN_LITERALS_FOR_4_STREAMS) refuses fewer than 6 literals in 4 streams,
         * and from 6 on, 3 streams of ceil(regen / 4) leave the fourth its share (review 53:
         * 3 and 4 literals were decoded here and refused by libzstd and zstandard) */
        if (regen < 6)
            return fail(err, "Huffman literals: %zu literals cannot be split in 4 streams "
                        "(6 at least)", regen);
        for (int k = 0; k < 4; k++) {
            if (bb_init(&b[k], p + at, sz[k]) != 0)
                return fail(err, "Huffman stream %d is empty or has no end marker", k + 1);
            at += sz[k];
            o[k] = out + seg * (size_t)k;
            end[k] = k < 3 ? o[k] + seg : out + regen;
        }
    }
    if (four) {
        for (;;) {
            int k;
            for (k = 0; k < 4; k++)
                if (b[k].pos < 8 || end[k] - o[k] < 5)
                    break;
            if (k < 4)
                break;
            HUF_FAST_REFILL(b[0]);
            HUF_FAST_REFILL(b[1]);
            HUF_FAST_REFILL(b[2]);
            HUF_FAST_REFILL(b[3]);
            for (int j = 0; j < 5; j++) {
                HUF_STEP(b[0], o[0]);
                HUF_STEP(b[1], o[1]);
                HUF_STEP(b[2], o[2]);
                HUF_STEP(b[3], o[3]);
            }
        }
    } else {
        while (b[0].pos >= 8 && end[0] - o[0] >= 5) {
            HUF_FAST_REFILL(b[0]);
            for (int j = 0; j < 5; j++)
                HUF_STEP(b[0], o[0]);
        }
    }
    for (int k = 0; k < streams; k++) {
        huf_tail(c, &b[k], o[k], end[k]);
        bb_refill(&b[k]);
        if (!bb_done(&b[k]))
            return fail(err, "Huffman stream %d %s", k + 1,
                        bb_overread(&b[k]) ? "ends before its literals do"
                                           : "has bits left after its literals");
    }
    return KP_ZSTD_OK;
}

/* ---------------------------------------------------------------- block decoding (RFC 3.1.1.3) */

typedef struct {
    const uint8_t *src_end; /* the end of the input: literals stored raw may be over-read to it */
    uint8_t *ostart, *oend; /* oend: the capacity, or the declared content size when smaller */
    int declared_end;       /* whether oend is the declared content size */
    size_t block_max;
    size_t at; /* the block's offset in the frame, for messages */
} Frame;

/* Names the block in the message a table or stream reader left in err. */
static int in_block(const Frame *f, char *err) {
    char inner[KP_ZSTD_ERROR_SIZE];
    memcpy(inner, err, sizeof inner);
    snprintf(err, KP_ZSTD_ERROR_SIZE, "corrupted block at offset %zu: %.200s", f->at, inner);
    return KP_ZSTD_CORRUPT;
}

/* The error for output that would pass oend. */
static int overflow(const Frame *f, char *err) {
    if (f->declared_end)
        return fail(err, "frame declares %zu bytes of content, its blocks hold more (block at "
                    "offset %zu)", (size_t)(f->oend - f->ostart), f->at);
    return fail(err, "output exceeds the %zu bytes allowed (block at offset %zu)",
                (size_t)(f->oend - f->ostart), f->at);
}

/* Literals section (RFC 3.1.1.3.1): *lits, *nlits, *lits_end (readable up to there) and
 * *used, the section's size. */
static int read_literals(Ctx *c, const Frame *f, const uint8_t *p, size_t n, size_t room,
                         const uint8_t **lits, size_t *nlits, const uint8_t **lits_end,
                         size_t *used, char *err) {
    unsigned type, format;
    size_t regen, hs;
    if (n < 1)
        return fail(err, "corrupted block at offset %zu: empty", f->at);
    type = p[0] & 3;
    format = (p[0] >> 2) & 3;
    if (type < 2) { /* raw or RLE */
        hs = format == 1 ? 2 : format == 3 ? 3 : 1;
        if (n < hs)
            return fail(err, "corrupted block at offset %zu: literals header longer than block",
                        f->at);
        regen = hs == 1 ? p[0] >> 3
                : hs == 2 ? (p[0] >> 4) + ((size_t)p[1] << 4)
                          : (p[0] >> 4) + ((size_t)p[1] << 4) + ((size_t)p[2] << 12);
    } else {
        size_t csize;
        uint64_t v;
        unsigned bits;
        hs = format < 2 ? 3 : format + 2;
        if (n < hs)
            return fail(err, "corrupted block at offset %zu: literals header longer than block",
                        f->at);
        bits = format < 2 ? 10 : format == 2 ? 14 : 18;
        v = 0;
        for (size_t i = 0; i < hs; i++)
            v |= (uint64_t)p[i] << (8 * i);
        regen = (size_t)(v >> 4) & ((1u << bits) - 1);
        csize = (size_t)(v >> (4 + bits)) & ((1u << bits) - 1);
        if (csize > n - hs)
            return fail(err, "corrupted block at offset %zu: literals section longer than block",
                        f->at);
        *used = hs + csize;
        if (regen > f->block_max || regen > room || regen > c->lits_cap)
            goto too_many;
        p += hs;
        if (type == 2) { /* a tree first; type 3 (treeless) reuses the last one */
            size_t tree = 0;
            if (read_huffman_tree(c, p, csize, &tree, err) != KP_ZSTD_OK)
                return in_block(f, err);
            p += tree;
            csize -= tree;
        } else if (c->huf_bits == 0) {
            return fail(err, "corrupted block at offset %zu: treeless literals without a "
                        "previous Huffman table", f->at);
        }
        if (huf_decode(c, p, csize, c->lits, regen, format != 0, err) != KP_ZSTD_OK)
            return in_block(f, err);
        *lits = c->lits;
        *nlits = regen;
        *lits_end = c->lits + c->lits_cap + WILD;
        return KP_ZSTD_OK;
    }
    if (regen > f->block_max || regen > room)
        goto too_many;
    if (type == 0) {
        if (regen > n - hs)
            return fail(err, "corrupted block at offset %zu: literals section longer than block",
                        f->at);
        *lits = p + hs;
        *lits_end = f->src_end;
        *used = hs + regen;
    } else {
        if (n - hs < 1)
            return fail(err, "corrupted block at offset %zu: literals section longer than block",
                        f->at);
        if (regen > c->lits_cap)
            goto too_many;
        memset(c->lits, p[hs], regen);
        *lits = c->lits;
        *lits_end = c->lits + c->lits_cap + WILD;
        *used = hs + 1;
    }
    *nlits = regen;
    return KP_ZSTD_OK;
too_many:
    if (regen > f->block_max)
        return fail(err, "corrupted block at offset %zu: %zu literals, more than the block "
                    "maximum (%zu bytes)", f->at, regen, f->block_max);
    return overflow(f, err);
}

/* The table of one sequences code for this block (RFC 3.1.1.3.2.1, Symbol_Compression_Modes);
 * *used: the bytes its description took. */
static int read_seq_table(Ctx *c, const Frame *f, int kind, unsigned mode, const uint8_t *p,
                          size_t n, size_t *used, char *err) {
    SeqEntry *t = c->seq[kind];
    const char *what = KIND_NAME[kind];
    unsigned maxsym = KIND_CODE_MAX[kind], log;
    *used = 0;
    if (mode == 3) { /* repeat */
        if (!c->seq_have[kind])
            return fail(err, "corrupted block at offset %zu: repeat mode for %s without a "
                        "previous table", f->at, what);
        return KP_ZSTD_OK;
    }
    if (mode == 1) { /* RLE: one code, no state bits */
        if (n < 1)
            return fail(err, "corrupted block at offset %zu: %s RLE code missing", f->at, what);
        if (p[0] > maxsym)
            return fail(err, "corrupted block at offset %zu: %s RLE code %u exceeds %u", f->at,
                        what, p[0], maxsym);
        seq_entry_value(&t[0], kind, p[0]);
        t[0].base = 0;
        t[0].nbits = 0;
        c->seq_log[kind] = 0;
        *used = 1;
    } else {
        int16_t norm[ML_CODE_MAX + 1];
        FseEntry fse[1 << LL_LOG_MAX];
        if (mode == 0) {
            const int16_t *d = kind == KIND_LL ? LL_DEFAULT : kind == KIND_ML ? ML_DEFAULT
                                                                              : OF_DEFAULT;
            unsigned count = kind == KIND_LL ? 36 : kind == KIND_ML ? 53 : 29;
            for (unsigned s = 0; s <= maxsym; s++)
                norm[s] = s < count ? d[s] : 0;
            log = kind == KIND_OF ? 5 : 6;
        } else if (read_fse_description(p, n, maxsym, KIND_LOG_MAX[kind], norm, &log, used, what,
                                        err) != KP_ZSTD_OK) {
            return in_block(f, err);
        }
        if (build_fse(norm, maxsym, log, fse, what, err) != KP_ZSTD_OK)
            return in_block(f, err);
        for (unsigned u = 0; u < (1u << log); u++) {
            unsigned code = fse[u].symbol;
            t[u].value = kind == KIND_LL ? LL_BASE[code] : kind == KIND_ML ? ML_BASE[code]
                                                                           : (uint32_t)1 << code;
            t[u].extra = kind == KIND_LL ? LL_BITS[code] : kind == KIND_ML ? ML_BITS[code]
                                                                           : (uint8_t)code;
            t[u].base = fse[u].base;
            t[u].nbits = fse[u].nbits;
        }
        c->seq_log[kind] = log;
    }
    c->seq_have[kind] = 1;
    return KP_ZSTD_OK;
}

/* Copies a match of len bytes from off bytes back (off <= bytes written, checked): 16 or 8
 * bytes at a time where the output has WILD bytes of room past the match, which the next
 * copy overwrites; overlapping short offsets repeat their pattern. */
static inline void copy_match(uint8_t *op, size_t off, size_t len, const uint8_t *oend) {
    const uint8_t *m = op - off;
    uint8_t *end = op + len;
    if (LIKELY((size_t)(oend - op) >= len + WILD)) {
        if (off >= 16) {
            do {
                memcpy(op, m, 16);
                op += 16;
                m += 16;
            } while (op < end);
            return;
        }
        if (off < 8) {
            /* the first 8 bytes one at a time, then 8-byte copies from a distance that is a
             * multiple of off and at least 8 (its pattern, already written) */
            for (int i = 0; i < 8; i++)
                op[i] = m[i];
            if (len <= 8)
                return;
            op += 8;
            m = op - off * ((8 + off - 1) / off);
        }
        do {
            memcpy(op, m, 8);
            op += 8;
            m += 8;
        } while (op < end);
        return;
    }
    if (off >= len) {
        memcpy(op, m, len);
    } else {
        while (op < end)
            *op++ = *m++;
    }
}

/* Decodes and runs the sequences section (RFC 3.1.1.3.2, 3.1.1.4), writing the block's
 * output at *opp. */
static int run_sequences(Ctx *c, const Frame *f, const uint8_t *p, size_t n, const uint8_t *lit,
                         size_t nlits, const uint8_t *lits_end, uint8_t **opp, char *err) {
    uint8_t *op = *opp, *oend = f->oend;
    uint8_t *limit = (size_t)(oend - op) > f->block_max ? op + f->block_max : oend;
    const uint8_t *lend = lit + nlits;
    size_t nseq, hs, rest;
    unsigned modes;
    BackBits b;
    uint32_t sl, so, sm, rep0 = c->rep[0], rep1 = c->rep[1], rep2 = c->rep[2];
    const SeqEntry *tl, *to, *tm;
    if (n < 1)
        return fail(err, "corrupted block at offset %zu: the sequences section is missing",
                    f->at);
    if (p[0] < 128) {
        nseq = p[0];
        hs = 1;
    } else if (p[0] < 255) {
        if (n < 2)
            goto truncated;
        nseq = ((size_t)(p[0] - 128) << 8) + p[1];
        hs = 2;
    } else {
        if (n < 3)
            goto truncated;
        nseq = p[1] + ((size_t)p[2] << 8) + 0x7F00;
        hs = 3;
    }
    if (nseq == 0) {
        if (n != hs)
            return fail(err, "corrupted block at offset %zu: %zu bytes after a sequences "
                        "section of no sequences", f->at, n - hs);
    } else {
        size_t at;
        if (n - hs < 1)
            goto truncated;
        modes = p[hs];
        if (modes & 3)
            return fail(err, "corrupted block at offset %zu: reserved bits of the symbol "
                        "compression modes are set (0x%02X)", f->at, modes);
        at = hs + 1;
        for (int kind = 0; kind < 3; kind++) { /* in the stream's order: LL, OF, ML */
            size_t used;
            unsigned mode = (modes >> (6 - 2 * kind)) & 3;
            if (read_seq_table(c, f, kind, mode, p + at, n - at, &used, err) != KP_ZSTD_OK)
                return KP_ZSTD_CORRUPT;
            at += used;
        }
        if (bb_init(&b, p + at, n - at) != 0)
            return fail(err, "corrupted block at offset %zu: the sequences bitstream is empty "
                        "or has no end marker", f->at);
        tl = c->seq[KIND_LL];
        to = c->seq[KIND_OF];
        tm = c->seq[KIND_ML];
        sl = bb_read(&b, c->seq_log[KIND_LL]);
        so = bb_read(&b, c->seq_log[KIND_OF]);
        sm = bb_read(&b, c->seq_log[KIND_ML]);
        for (size_t i = 0; i < nseq; i++) {
            const SeqEntry *el = &tl[sl], *eo = &to[so], *em = &tm[sm];
            size_t ll, ml, off;
            uint32_t ofv;
            unsigned need = (unsigned)eo->extra + em->extra + el->extra;
            int more = i + 1 < nseq;
            bb_refill(&b);
            if (more)
                need += (unsigned)el->nbits + em->nbits + eo->nbits;
            if (LIKELY(b.used + need < 64)) { /* the usual case: all of this sequence's bits are here */
                ofv = eo->value + bb_read_in(&b, eo->extra);
                ml = em->value + bb_read_in(&b, em->extra);
                ll = el->value + bb_read_in(&b, el->extra);
                if (more) {
                    sl = el->base + bb_read_in(&b, el->nbits);
                    sm = em->base + bb_read_in(&b, em->nbits);
                    so = eo->base + bb_read_in(&b, eo->nbits);
                }
            } else { /* up to 89 bits, or the stream's last ones: refilled and checked reads */
                ofv = eo->value + bb_read(&b, eo->extra); /* offset bits first, <= 31 */
                bb_refill(&b);
                ml = em->value + bb_read(&b, em->extra);
                ll = el->value + bb_read(&b, el->extra);
                if (more) { /* state updates: LL, ML, OF */
                    bb_refill(&b);
                    sl = el->base + bb_read(&b, el->nbits);
                    sm = em->base + bb_read(&b, em->nbits);
                    so = eo->base + bb_read(&b, eo->nbits);
                }
            }
            if (ofv > 3) {
                off = ofv - 3;
                rep2 = rep1;
                rep1 = rep0;
                rep0 = (uint32_t)off;
            } else { /* a repeat offset; with no literals the choices shift by one */
                unsigned k = ofv - 1 + (ll == 0);
                if (k == 0) {
                    off = rep0;
                } else {
                    off = k == 1 ? rep1 : k == 2 ? rep2 : (size_t)rep0 - 1;
                    if (UNLIKELY(off == 0))
                        return fail(err, "corrupted block at offset %zu: sequence %zu repeats "
                                    "offset 0", f->at, i);
                    if (k != 1)
                        rep2 = rep1;
                    rep1 = rep0;
                    rep0 = (uint32_t)off;
                }
            }
            if (UNLIKELY(ll > (size_t)(lend - lit)))
                return fail(err, "corrupted block at offset %zu: sequence %zu takes %zu "
                            "literals, %zu left", f->at, i, ll, (size_t)(lend - lit));
            if (UNLIKELY(ll + ml > (size_t)(limit - op)))
                goto too_long;
            if (LIKELY((size_t)(oend - op) >= ll + WILD && (size_t)(lits_end - lit) >= ll + WILD)) {
                uint8_t *d = op, *e = op + ll;
                const uint8_t *s = lit;
                do {
                    memcpy(d, s, 16);
                    d += 16;
                    s += 16;
                } while (d < e);
            } else {
                memcpy(op, lit, ll);
            }
            op += ll;
            lit += ll;
            if (UNLIKELY(off > (size_t)(op - f->ostart)))
                return fail(err, "corrupted block at offset %zu: sequence %zu's offset %zu "
                            "points before the start of the output (%zu bytes written)", f->at,
                            i, off, (size_t)(op - f->ostart));
            copy_match(op, off, ml, oend);
            op += ml;
        }
        bb_refill(&b);
        if (!bb_done(&b))
            return fail(err, "corrupted block at offset %zu: the sequences bitstream %s", f->at,
                        bb_overread(&b) ? "ends before its sequences do"
                                        : "has bits left after its sequences");
        c->rep[0] = rep0;
        c->rep[1] = rep1;
        c->rep[2] = rep2;
    }
    rest = (size_t)(lend - lit);
    if (rest > (size_t)(limit - op))
        goto too_long;
    memcpy(op, lit, rest);
    *opp = op + rest;
    return KP_ZSTD_OK;
truncated:
    return fail(err, "corrupted block at offset %zu: sequences header longer than block", f->at);
too_long:
    if (limit == oend)
        return overflow(f, err);
    return fail(err, "corrupted block at offset %zu: decodes to more than the block maximum "
                "(%zu bytes)", f->at, f->block_max);
}

/* ---------------------------------------------------------------- frame decoding (RFC 3.1.1) */

static int new_ctx(Ctx **cp, size_t block_max, size_t cap, char *err) {
    size_t lits_cap = block_max < cap ? block_max : cap;
    Ctx *c = (Ctx *)malloc(sizeof(Ctx) + lits_cap + WILD);
    if (c == NULL) {
        snprintf(err, KP_ZSTD_ERROR_SIZE, "out of memory for the decoder's tables");
        return KP_ZSTD_NOMEM;
    }
    c->huf_bits = 0;
    c->seq_have[0] = c->seq_have[1] = c->seq_have[2] = 0;
    c->rep[0] = 1; /* RFC 3.1.1.5: the initial repeat offsets */
    c->rep[1] = 4;
    c->rep[2] = 8;
    c->lits_cap = lits_cap;
    *cp = c;
    return KP_ZSTD_OK;
}

int kp_zstd_decompress(const uint8_t *src, size_t len, uint8_t *dst, size_t cap, size_t *got,
                       char *err) {
    Header h;
    Frame f;
    Ctx *c = NULL;
    size_t pos;
    uint8_t *op = dst;
    int rc = KP_ZSTD_OK;
    err[0] = 0;
    if (read_header(src, len, &h, err) != KP_ZSTD_OK)
        return KP_ZSTD_CORRUPT;
    if (h.dict_id != 0)
        return fail(err, "frame needs dictionary %u: dictionaries are not supported",
                    (unsigned)h.dict_id);
    if (h.has_content_size && h.content_size > cap)
        return fail(err, "frame declares %llu bytes of content, more than the %zu allowed",
                    (unsigned long long)h.content_size, cap);
    f.src_end = src + len;
    f.ostart = dst;
    f.declared_end = h.has_content_size && h.content_size <= cap;
    f.oend = dst + (f.declared_end ? (size_t)h.content_size : cap);
    f.block_max = block_maximum(&h);
    pos = h.size;
    for (;;) {
        uint32_t bh, type, bsize;
        size_t room = (size_t)(f.oend - op);
        f.at = pos;
        if (len - pos < 3) {
            rc = fail(err, "frame truncated at offset %zu: a block header needs 3 bytes", len);
            break;
        }
        bh = le24(src + pos);
        pos += 3;
        type = (bh >> 1) & 3;
        bsize = bh >> 3;
        if (type == 3) {
            rc = fail(err, "block at offset %zu: reserved block type 3", f.at);
            break;
        }
        if (bsize > f.block_max) {
            rc = fail(err, "block at offset %zu: size %u exceeds the block maximum %zu", f.at,
                      (unsigned)bsize, f.block_max);
            break;
        }
        if (len - pos < (type == 1 ? 1 : bsize)) {
            rc = fail(err, "frame truncated at offset %zu: block at offset %zu needs %u bytes",
                      len, f.at, type == 1 ? 1u : (unsigned)bsize);
            break;
        }
        if (type < 2 && bsize > room) {
            rc = overflow(&f, err);
            break;
        }
        if (type == 0) {
            memcpy(op, src + pos, bsize);
            op += bsize;
            pos += bsize;
        } else if (type == 1) {
            memset(op, src[pos], bsize);
            op += bsize;
            pos += 1;
        } else {
            const uint8_t *lits = NULL, *lits_end = NULL;
            size_t nlits = 0, used = 0;
            if (c == NULL &&
                (rc = new_ctx(&c, f.block_max, (size_t)(f.oend - dst), err)) != KP_ZSTD_OK)
                break;
            rc = read_literals(c, &f, src + pos, bsize, room, &lits, &nlits, &lits_end, &used,
                               err);
            if (rc != KP_ZSTD_OK)
                break;
            rc = run_sequences(c, &f, src + pos + used, bsize - used, lits, nlits, lits_end, &op,
                               err);
            if (rc != KP_ZSTD_OK)
                break;
            pos += bsize;
        }
        if (bh & 1)
            break;
    }
    free(c);
    if (rc != KP_ZSTD_OK)
        return rc;
    if (h.has_content_size && (uint64_t)(op - dst) != h.content_size)
        return fail(err, "frame declares %llu bytes of content, its blocks hold %zu",
                    (unsigned long long)h.content_size, (size_t)(op - dst));
    if (h.checksum) {
        uint32_t want, have;
        if (len - pos < 4)
            return fail(err, "frame truncated at offset %zu: the content checksum needs 4 bytes",
                        len);
        want = le32(src + pos);
        have = (uint32_t)xxh64(dst, (size_t)(op - dst));
        if (want != have)
            return fail(err, "content checksum mismatch: the frame says 0x%08X, the content "
                        "hashes to 0x%08X", (unsigned)want, (unsigned)have);
    }
    *got = (size_t)(op - dst);
    return KP_ZSTD_OK;
}
