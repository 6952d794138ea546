"""The Triton source of the CUDA kernels, one module per launcher module; imported only to compile."""
