"""Lowering and composition: a costed execution graph of the step, and what is read from it."""
