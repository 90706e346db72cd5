"""The measuring layer: is the split right, and what does it cost.

- :mod:`graphkit.measure.verification`: :func:`~graphkit.measure.verification.verify_split`, the split
  backward against a full backward, gradient by gradient;
- :mod:`graphkit.measure.gradient_check`: :class:`~graphkit.measure.gradient_check.GradientCheck`, one
  gradient against its reference, as ``verify_split`` and ``verify_pipeline`` compare them;
- :mod:`graphkit.measure.flops`: FLOPs per Node and the one helper that counts FLOPs of the forward,
  the full backward, B and W (:class:`~graphkit.measure.flops.PhaseFlops`);
- :mod:`graphkit.measure.benchmark`: timing B + W against a full backward;
- :mod:`graphkit.measure.costs`: time, FLOPs and memory of each stage's F, B (I) and W, as schedulers
  take them;
- :mod:`graphkit.measure.timing`: the timer they share, the load, the sign test;
- :mod:`graphkit.measure.paired_rounds`: steps measured in rounds (balanced orders, paired ratios, the A/A
  noise floor);
- :mod:`graphkit.measure.allocator`: the CPU allocator graphkit's processes measure under (glibc's malloc
  without ``mmap`` or trimming, unless ``GRAPHKIT_ALLOCATOR=default``);
- :mod:`graphkit.measure.stage_inputs`: running a stage on its device and on fresh copies of its inputs,
  as verification, benchmarks and costs do.

It loads on first use (``from graphkit.measure.verification import verify_split``), so ``import graphkit``
stays light.
"""
