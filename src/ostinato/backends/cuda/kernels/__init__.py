"""Triton kernels for ostinato's fused ops, each behind a launcher with the reference's signature."""
