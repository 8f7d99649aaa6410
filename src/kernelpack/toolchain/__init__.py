"""Compile-time tools (nvJitLink, LLVM). Never imported on the load path."""
