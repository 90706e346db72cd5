"""graphkit: see, analyse and split PyTorch autograd graphs."""
