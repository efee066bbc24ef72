"""The node validator: checks driver, toolkit, CUDA, device plugin and MIG, and writes the barrier files the
operands' init containers wait on."""
