"""Placement on a Ray cluster (`cluster.backend = "ray"`): the trainer ranks as a group of
actors forming one torch process group, and engine servers as actors that launch and supervise
them. The objects the loop drives are the single-process ones behind the same interfaces
(`RayTrainer` is a `Trainer` to the loop, `RayEngineLauncher` an `EngineLauncher` to the pool);
only where they run changes. Ray is imported only here, and only when configured."""
