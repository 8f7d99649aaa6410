/*
 * kernelpack's own zstd frame decoder (_zstd_inflate.c): what it answers and how it fails.
 *
 * Plain C99, no global mutable state: every call may run on any thread, with or without the
 * GIL. Inputs are untrusted: every function bounds every read and write, and answers an error
 * code with a short message in `err` (KP_ZSTD_ERROR_SIZE bytes, NUL-terminated) rather than
 * crash or truncate.
 */
#ifndef KP_ZSTD_INFLATE_H
#define KP_ZSTD_INFLATE_H

#include <stddef.h>
#include <stdint.h>

#define KP_ZSTD_ERROR_SIZE 256 /* room for one message, NUL included */

enum {
    KP_ZSTD_OK = 0,       /* done; for a content size: the frame declares it */
    KP_ZSTD_UNKNOWN = 1,  /* kp_zstd_content_size: the frame declares no content size */
    KP_ZSTD_CORRUPT = -1, /* not a frame this decoder reads, or a damaged one: see err */
    KP_ZSTD_NOMEM = -2,   /* malloc failed (err says so too) */
};

/* The content size the first frame's header declares (*size, KP_ZSTD_OK), KP_ZSTD_UNKNOWN
 * when it declares none, KP_ZSTD_CORRUPT when the header is not a readable zstd frame header
 * (truncated, another magic number, a skippable frame, a reserved bit set, a window log over
 * 31). Only the header is read. */
int kp_zstd_content_size(const uint8_t *src, size_t len, uint64_t *size, char *err);

/* The size in bytes of the first frame of src (header, blocks, checksum), from its block
 * headers alone: KP_ZSTD_OK or KP_ZSTD_CORRUPT. */
int kp_zstd_frame_size(const uint8_t *src, size_t len, size_t *size, char *err);

/* Decodes the first frame of src into dst[0, cap): KP_ZSTD_OK with *got the number of bytes
 * written, or an error (nothing in dst is meaningful then). A frame declaring more than cap
 * bytes, or one without a declared size whose content exceeds cap, is an error; nothing is
 * written past a declared size below cap (dst may be that small); bytes after the first frame
 * are not read. src and dst must not overlap. */
int kp_zstd_decompress(const uint8_t *src, size_t len, uint8_t *dst, size_t cap, size_t *got,
                       char *err);

#endif
