"""Layer 4, workloads: models, matmuls, image feeds, sweeps, sampling, 08's training loop; imports layers 1-3 only."""
