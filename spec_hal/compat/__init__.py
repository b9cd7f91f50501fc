"""Drop-in entry points with the names, signatures and output conventions of other libraries.

    from spec_hal.compat import sgl_kernel      # instead of: import sgl_kernel
    from spec_hal.compat import flashinfer      # instead of: import flashinfer.sampling as flashinfer
    from spec_hal.compat import vllm            # rejection_sample of vllm.v1.sample.rejection_sampler

Each function is a thin wrapper over spec_hal's native ops (``spec_hal.verify_sampling``,
``spec_hal.build_tree``, ...): it reshapes, views and writes the caller's buffers in place the way
the upstream function does, and the op itself runs on the backend for the tensors' device (cpu,
triton-interpret, cuda, rocm or a plugin). Where the upstream semantics cannot be matched exactly
(spec_hal samples with exact integer CDFs and a strict ``<``; upstream libraries draw their own
random numbers), the function's docstring and ``docs/compat.md`` say what differs.

Importing this package does no device work and imports none of the upstream libraries.
"""
