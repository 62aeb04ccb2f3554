"""Graph passes: analyses return values, transforms return new graphs."""
