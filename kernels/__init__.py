"""velo-chat kernels."""
