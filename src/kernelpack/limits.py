"""Hard limits of the format and the loader, in one place.

Every count, length and size read from an artifact is checked against these *before* anything
is allocated or decoded, so a hostile file can never make the loader allocate gigabytes or loop
for minutes. Writers refuse to produce files that readers would refuse.
"""

from __future__ import annotations

__all__ = [
    "FORMAT_MAJOR", "FORMAT_MINOR", "FILE_IDENTIFIER",
    "MAX_FILE_SIZE", "MAX_PROGRAMS", "MAX_MODULES", "MAX_IMAGES_PER_MODULE", "MAX_KERNELS",
    "MAX_PARAMS", "MAX_RANK", "MAX_LAUNCHES", "MAX_ARGS", "MAX_VARIANTS", "MAX_CONSTRAINTS",
    "MAX_SCRATCH", "MAX_NAME_LENGTH", "MAX_TEXT_LENGTH", "MAX_SYMBOLS", "MAX_EXPR_OPS",
    "MAX_EXPR_ROOTS", "MAX_EXPR_STACK", "MAX_EXPR_DEPTH", "MAX_EXPR_WORK", "MAX_IMAGE_SIZE",
    "MAX_LAUNCH_REPEAT", "MAX_PLANNED_LAUNCHES",
    "MAX_TABLE_DEPTH", "MAX_BLOBS", "DIGEST_SIZE", "fits_name", "shown_int",
]

FILE_IDENTIFIER = b"KPAK"
FORMAT_MAJOR = 1
FORMAT_MINOR = 1

MAX_FILE_SIZE = (1 << 31) - 1          # FlatBuffers' own offset range
MAX_PROGRAMS = 100_000
MAX_MODULES = 100_000
MAX_IMAGES_PER_MODULE = 64
MAX_KERNELS = 4_096                    # kernel entries per module
MAX_PARAMS = 256                       # parameters per program
MAX_RANK = 16                          # dims per tensor
MAX_LAUNCHES = 4_096                   # launches per variant
MAX_ARGS = 512                         # kernel arguments per launch
MAX_VARIANTS = 64
MAX_CONSTRAINTS = 1_024
MAX_SCRATCH = 256                      # scratch buffers per variant
MAX_NAME_LENGTH = 1_024                # identifiers: programs, params, kernels, symbols
MAX_TEXT_LENGTH = 64 * 1024            # free text: messages, toolchain strings
MAX_SYMBOLS = 4_096
MAX_EXPR_OPS = 1 << 20
MAX_EXPR_ROOTS = 1 << 18
MAX_EXPR_STACK = 256
MAX_EXPR_DEPTH = 256                   # nesting of one expression, LOADs followed: evaluation
                                       # recurses this deep, so it must stay far below Python's
                                       # recursion limit (a chain of NEGs needs no stack)
MAX_EXPR_WORK = 1 << 20                # expression nodes one program's fields read in all:
                                       # distinct nodes per field, a subexpression shared
                                       # through LOAD counted once per field that reads it
                                       # (the encoder and printing walk each field on its own;
                                       # the reference workloads use under 200)
MAX_IMAGE_SIZE = 1 << 30               # decompressed bytes of one image
MAX_LAUNCH_REPEAT = 1 << 20            # evaluated `count` of a repeated launch
MAX_PLANNED_LAUNCHES = 1 << 20         # launches of one plan, repeats expanded (a few of
                                       # 2^20-fold launches would otherwise cost gigabytes)
MAX_TABLE_DEPTH = 16                   # nesting of tables the verifier will follow
MAX_BLOBS = 1 << 20                    # stored image blobs per file
DIGEST_SIZE = 32                       # SHA-256


def fits_name(text: str) -> bool:
    """Whether ``text`` fits MAX_NAME_LENGTH, which counts UTF-8 bytes as the format does: a
    name of 600 ``é`` is 1200 bytes. Encoded only when it could be over (a quarter of the
    limit in characters), since every decoded name comes through here."""
    return len(text) <= MAX_NAME_LENGTH // 4 or len(text.encode("utf-8", "surrogatepass")) \
        <= MAX_NAME_LENGTH


def shown_int(value: int) -> str:
    """``value`` for an error message. Past a few hundred digits, its size instead of its
    digits: ``str()`` of an int longer than ``sys.get_int_max_str_digits()`` raises, and that
    ValueError replaced the error naming the parameter (review 34)."""
    if value.bit_length() <= 1024:
        return str(value)
    return f"{'a negative' if value < 0 else 'an'} integer of {value.bit_length()} bits"
