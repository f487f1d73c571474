"""Independent float64 NumPy references (brute force, O(n²) memory in blocks) used by the tests as oracles and
by the benchmarks as the papers' "sequential" baseline. They share no code with the implementations they check.
"""
