"""``prepare`` as stages over partitions: each stage module has ``tasks(plan) -> int`` and
``run(plan, work, index, out)``, a pure function of the plan and earlier stages' outputs that
writes its files into ``out``. ``task.run_task`` wraps one call with the completion marker."""

STAGES = ("read", "exact", "signatures", "buckets", "verify", "clusters", "vocab", "write",
          "finalize")
