/*
 * Shared between the two halves of kernelpack.runtime._launch: the driver's cuLaunchKernel
 * entry point (bound once by runtime/native.py) and what each half registers in the module.
 */
#ifndef KERNELPACK_LAUNCH_H
#define KERNELPACK_LAUNCH_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

/* The driver's own signature (cuda.h): CUresult cuLaunchKernel(CUfunction f, unsigned int
 * gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, unsigned int sharedMemBytes,
 * CUstream hStream, void **kernelParams, void **extra). CUresult is an int-sized enum;
 * CUfunction and CUstream are pointers. */
typedef int (*kp_launch_fn)(void *, unsigned int, unsigned int, unsigned int, unsigned int,
                            unsigned int, unsigned int, unsigned int, void *, void **, void **);

/* NULL until bind(); set once per process (by _launch.c). */
extern kp_launch_fn kp_cu_launch_kernel;

/* _fastcall.c: adds the FastCall type and forget_contexts() to the module; -1 on error. */
int kp_fastcall_init(PyObject *module);

/* ../_verify.c: adds verify_fast (the artifact verifier's C walker) to the module; -1 on error. */
int kp_verify_init(PyObject *module);
int kp_fbread_init(PyObject *module); /* ../_fbread.c: the summary reader's bulk read */

/* ../_zstd.c: adds zstd_open/zstd_content_size/zstd_decompress (libzstd through dlopen). */
int kp_zstd_init(PyObject *module);

/* _drvcall.c: the driver's entry points called from C (runtime/libcuda.py). */
int kp_drvcall_init(PyObject *module);

/* ../_fdowner.c: owned_dup, a descriptor closed from C (kernelpack/_images.py's PackFile). */
int kp_fdowner_init(PyObject *module);

#endif
