"""Files that outlive a process: verified atomic checkpoints of one pytree
(:mod:`.checkpoint`) and exclusive file locks (:mod:`.locks`)."""

__all__ = ["checkpoint", "locks"]
