"""``schema/kernelpack.fbs`` as Python data: the tables, structs, enums and defaults that the
verifier (:mod:`kernelpack.verify`) checks a buffer against and the reader
(:mod:`kernelpack._fbread`) reads with.

Kept by hand beside the schema rather than generated from it, so that every field carries its
limit (the longest string, the largest vector count) from :mod:`kernelpack.limits`: flatc knows
no limits. ``tests/test_verify.py`` parses the ``.fbs`` and fails when the two drift apart.
"""

from __future__ import annotations

from .limits import (DIGEST_SIZE, MAX_ARGS, MAX_BLOBS, MAX_CONSTRAINTS, MAX_EXPR_OPS,
                     MAX_FILE_SIZE, MAX_IMAGE_SIZE, MAX_IMAGES_PER_MODULE, MAX_KERNELS,
                     MAX_LAUNCHES, MAX_MODULES, MAX_NAME_LENGTH, MAX_PARAMS, MAX_PROGRAMS,
                     MAX_RANK, MAX_SCRATCH, MAX_SYMBOLS, MAX_TEXT_LENGTH, MAX_VARIANTS)

__all__ = ["SCALARS", "ENUMS", "STRUCTS", "TABLES", "DEFAULTS", "BODY_ALIGNMENT"]

# scalar type -> (size, struct code)
SCALARS: dict[str, tuple[int, str]] = {
    "bool": (1, "B"), "u8": (1, "B"), "u16": (2, "H"), "u32": (4, "I"), "i32": (4, "i"),
    "u64": (8, "Q"), "i64": (8, "q"),
}
# enum -> number of values (valid values are 0 .. n-1); all enums are ubyte.
ENUMS: dict[str, int] = {
    "ImageKind": 3, "Codec": 2, "ArchSuffix": 3, "ParamKind": 2, "Role": 3, "ArgKind": 3,
    "DType": 16,
}
# struct -> (size, alignment, fields as (name, scalar type))
STRUCTS: dict[str, tuple[int, int, tuple[tuple[str, str], ...]]] = {
    "Dim3": (12, 4, (("x", "u32"), ("y", "u32"), ("z", "u32"))),
    "Version": (2, 1, (("major", "u8"), ("minor", "u8"))),
}
N, T = MAX_NAME_LENGTH, MAX_TEXT_LENGTH
# table -> fields in slot order: (name, type, limit). Types: a scalar, an enum, a struct, a
# table, "str", or "[elem]" for a vector of scalars, strings ("[str]") or tables. The limit
# is the maximum string length or vector count (0 for scalars, structs and tables).
TABLES: dict[str, tuple[tuple[str, str, int], ...]] = {
    "Blob": (("data", "[u8]", MAX_IMAGE_SIZE),),
    "Signature": (("public_key", "[u8]", 32), ("signature", "[u8]", 64)),
    "Pack": (("format_major", "u16", 0), ("format_minor", "u16", 0),
             ("body", "[u8]", MAX_FILE_SIZE), ("body_digest", "[u8]", DIGEST_SIZE),
             ("blobs", "[Blob]", MAX_BLOBS), ("signature", "Signature", 0)),
    "Body": (("generator", "str", T), ("programs", "[Program]", MAX_PROGRAMS),
             ("modules", "[Module]", MAX_MODULES)),
    "Module": (("name", "str", N), ("kernels", "[str]", MAX_KERNELS),
               ("images", "[ImageMeta]", MAX_IMAGES_PER_MODULE)),
    "ImageMeta": (("kind", "ImageKind", 0), ("arch_major", "u8", 0), ("arch_minor", "u8", 0),
                  ("arch_suffix", "ArchSuffix", 0), ("ptx_isa", "Version", 0),
                  ("cuda_version", "u32", 0), ("toolchain", "str", T), ("codec", "Codec", 0),
                  ("raw_size", "u64", 0), ("digest", "[u8]", DIGEST_SIZE),
                  ("raw_digest", "[u8]", DIGEST_SIZE), ("blob", "u32", 0)),
    "Program": (("name", "str", N), ("symbols", "[str]", MAX_SYMBOLS),
                ("ops", "[u8]", MAX_EXPR_OPS), ("imms", "[i64]", MAX_EXPR_OPS),
                ("params", "[Param]", MAX_PARAMS), ("constraints", "[Constraint]", MAX_CONSTRAINTS),
                ("variants", "[Variant]", MAX_VARIANTS)),
    "Param": (("kind", "ParamKind", 0), ("name", "str", N), ("dtype", "DType", 0),
              ("role", "Role", 0), ("zero_init", "bool", 0), ("shape", "[u32]", MAX_RANK),
              ("value", "i32", 0)),
    "Constraint": (("predicate", "u32", 0), ("message", "str", T)),
    "Scratch": (("name", "str", N), ("dtype", "DType", 0), ("shape", "[u32]", MAX_RANK),
                ("zero_init", "bool", 0)),
    "Arg": (("kind", "ArgKind", 0), ("name", "str", N), ("value", "u32", 0),
            ("dtype", "DType", 0)),
    "Launch": (("kernel", "str", N), ("module", "str", N), ("grid", "Dim3", 0),
               ("block", "Dim3", 0), ("shared_mem", "u32", 0), ("count", "i32", 0),
               ("loop", "str", N), ("args", "[Arg]", MAX_ARGS),
               # format 1.1:
               ("reads_elsewhere", "[str]", MAX_ARGS), ("stores_after_loads", "bool", 0)),
    "Variant": (("predicate", "i32", 0), ("scratch", "[Scratch]", MAX_SCRATCH),
                ("launches", "[Launch]", MAX_LAUNCHES)),
}
del N, T
# Non-zero schema defaults of scalar fields (absent field -> this value).
DEFAULTS: dict[tuple[str, str], int] = {
    ("Param", "value"): -1, ("Launch", "count"): -1, ("Variant", "predicate"): -1,
}

# The nested body must start 8-aligned in the file so its int64 vectors stay aligned.
BODY_ALIGNMENT = 8
