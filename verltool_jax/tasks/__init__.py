"""Generated tasks (data written in the verl layout): ``tiny_math``."""
