"""The fault suite: missing, late, killed and failing ranks, mismatches, bad input, aliasing,
NaN and overflow, concurrency, and calls after a failure, over every transport."""
